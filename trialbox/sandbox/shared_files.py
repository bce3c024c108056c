"""Files that runners on one machine share: the sandbox runtime's plugin, each state dir's
/etc for the sandboxes, the twin's cached template. Tests, the demo and workers run at once,
and a sandbox may start while another process refreshes one of them, so a file is written
whole (a temporary file renamed over it) and only when its content changes; a build that
takes a while happens under an exclusive lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def publish(path: Path, data: bytes, mode: int = 0o644) -> bool:
    """Make `path` hold `data`: readers see the old file or the new one, never a part.
    Returns whether it was written."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return True


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Held by one process at a time, machine-wide (released when the holder dies)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def try_exclusive(lock: Path) -> int | None:
    """`lock` held by this process, machine-wide, if no other holds it: the fd (closing it
    releases the lock; it is not inherited); else None, at once."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
