"""A session's messages: the open (on the pool's work queue), each call (on the session's
inbox queue) and each reply (on its outbox queue). Queues are per session, so a call never
waits behind another session's, and none goes through a state machine or a function."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from trialbox.models.common import Files, Metadata, StrictModel
from trialbox.models.limits import Limits
from trialbox.models.report import CommandResult, Status
from trialbox.models.sample import Argv, CheckpointId

SESSION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,40}$"
SessionId = Annotated[str, Field(pattern=SESSION_ID_PATTERN)]
MAX_TTL_S = 24 * 3600
MAX_STEP_COMMANDS = 32
ALIVE_S = 1.0  # a worker's sign of life while a call runs (the first on receipt)
FAILOVER_S = 5.0  # a client hearing nothing this long during a call takes the worker for lost
# A session queue's tag: when its session ends (epoch s). The reaper deletes queues past it.
TAG_EXPIRES = "trialbox:expires_at"


class SessionSpec(StrictModel):
    """What a worker needs to host a session: the task's starter files, never its hidden
    tests (those reach only the grading run, `Session.grade`)."""

    session_id: SessionId
    task_id: str
    workspace: Files = Field(default_factory=dict, description="the task's starter files")
    limits: Limits
    checkpoint: CheckpointId | None = Field(default=None, description="restore this first")
    files: Files = Field(default_factory=dict)
    seq: int = Field(default=0, ge=0, description="calls already answered (a restore's)")
    epoch: int = Field(
        default=0,
        ge=0,
        description="failovers so far: a call of a later one tells a superseded host to step aside",
    )
    expires_at: float = Field(description="epoch s: the TTL; the host ends the session then")
    idle_release_s: float = Field(gt=0, description="checkpoint and free the slot when idle")
    inbox_url: str
    outbox_url: str
    run_id: str | None = None
    episode_id: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    metadata: Metadata = None


class SessionOpen(StrictModel):
    """A work-queue message that asks a worker to host a session."""

    session: SessionSpec


Op = Literal["exec", "write", "read", "close"]


class Call(StrictModel):
    """One tool call. `seq` numbers a session's calls from 1; a call whose seq was answered
    already gets its recorded reply again, and never runs twice."""

    seq: int = Field(ge=1)
    epoch: int = Field(default=0, ge=0, description="the session's failovers when it was sent")
    op: Op
    commands: list[Argv] = Field(default_factory=list, max_length=MAX_STEP_COMMANDS)
    files: Files = Field(default_factory=dict)
    path: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class CallResult(StrictModel):
    """A call's outcome. `status` is the worst of its commands' (`timeout`, `oom`: the
    policy's, scored); `sandbox_error` (with `loss_mask`) when the platform failed it."""

    session_id: str
    seq: int
    op: Op
    status: Status
    loss_mask: bool = False
    commands: list[CommandResult] = Field(default_factory=list)
    content: str | None = Field(default=None, description="read: the file, base64")
    error: str | None = None
    feedback: str = ""
    checkpoint: str | None = Field(default=None, description="the workspace after this call")
    worker: str | None = None
    restored_s: float | None = Field(
        default=None, description="the call first restored the workspace, taking this long"
    )


class Reply(StrictModel):
    """An outbox message: the session is open, a call's result, or a worker's sign of life
    while a call runs (the client fails over when these stop)."""

    kind: Literal["opened", "alive", "result", "failed"]
    session_id: str
    seq: int = 0
    worker: str | None = None
    checkpoint: str | None = None
    result: CallResult | None = None
    result_uri: str | None = Field(
        default=None, description="a result too large for a message: its trace file"
    )
    error: str | None = None
    others: int = Field(
        default=0,
        ge=0,
        description="alive: other calls and jobs running on the worker (0: this call alone)",
    )
