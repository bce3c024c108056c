"""The storage layout: every S3 key the pipeline, the SDK and the stack's IAM policies name.

Task sets and payloads are content-addressed (immutable); job files, reports and traces are
keyed by request id.
"""

from __future__ import annotations

import hashlib

TRACES_PREFIX = "traces/"
JOBS_PREFIX = "jobs/"
PAYLOADS_PREFIX = "payloads/"
TASKSETS_PREFIX = "tasksets/"
CHECKPOINTS_PREFIX = "checkpoints/"
SESSIONS_PREFIX = "sessions/"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def taskset_key(taskset: str, version: str) -> str:
    """A task set file in the task-sets bucket; `version` is the file's sha256."""
    return f"{TASKSETS_PREFIX}{taskset}@{version}.jsonl"


def payload_key(content_sha256: str) -> str:
    """A request too large for a queue message, in the traces bucket, by its content hash."""
    return f"{PAYLOADS_PREFIX}{content_sha256}.json"


def checkpoint_key(checkpoint: str) -> str:
    """A workspace snapshot (a tar.gz) in the traces bucket, by its sha256: the same workspace
    is stored once, and a reader checks what it got against the key."""
    return f"{CHECKPOINTS_PREFIX}{checkpoint}.tar.gz"


def execution_arn(rollout_arn: str, request_id: str) -> str:
    """A request's Rollout execution: it is named after the request id (its idempotency key)."""
    return rollout_arn.replace(":stateMachine:", ":execution:", 1) + f":{request_id}"


def session_call_key(session_id: str, seq: int) -> str:
    """A session's trace, a file per call: the call and its result, for replay."""
    return f"{SESSIONS_PREFIX}{session_id}/{seq:06d}.json"


def job_key(request_id: str, name: str) -> str:
    """A request's job files: job.json (Prepare), report.json (worker)."""
    return f"{JOBS_PREFIX}{request_id}/{name}"


def trace_key(request_id: str) -> str:
    return f"{TRACES_PREFIX}{request_id}.json"
