"""A workspace checkpoint in S3, by its content address: what a job starts from and saves, and
what a session restores and keeps (the worker's jobs and sessions both use it)."""

from __future__ import annotations

from trialbox.errors import SandboxError
from trialbox.keys import checkpoint_key, sha256_hex
from trialbox.pipeline.stores import ObjectStore


def load_checkpoint(store: ObjectStore, checkpoint: str) -> bytes:
    """A checkpoint's archive, checked against its content address."""
    data = store.get_bytes(store.uri(checkpoint_key(checkpoint)))
    if sha256_hex(data) != checkpoint:
        raise SandboxError(f"checkpoint {checkpoint} does not match its sha256: it is corrupt")
    return data


def save_checkpoint(store: ObjectStore, data: bytes) -> str:
    """Store an archive under its content address; its id."""
    checkpoint = sha256_hex(data)
    store.put_bytes(checkpoint_key(checkpoint), data, "application/gzip")
    return checkpoint
