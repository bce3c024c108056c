"""A session's messages: the open (on the stack's open queue), each call (on its hosting
worker's inbox queue) and each reply (on its client's reply queue). No queue is a session's
own: a worker's inbox carries the calls of every session it hosts and a client's reply queue
the replies of every session it opened, each message naming its session (SQS "virtual
queues"), so queues are made per worker and per client, never per session. None goes
through a state machine or a function."""

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
# A client waits this long for a worker to take its open (a pool scaling out from zero takes
# minutes); the open queue keeps a message no longer, so an open given up on is never hosted.
OPEN_TIMEOUT_S = 300
# A session queue's tag (a worker's inbox, a client's reply queue): when its owner stops
# needing it (epoch s), renewed while it does. The reaper deletes queues past it.
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
    reply_url: str = Field(description="the client's reply queue")
    stored_bytes: int = Field(
        default=0, ge=0, description="checkpoint bytes its earlier hosts stored (its quota's)"
    )
    run_id: str | None = None
    episode_id: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    metadata: Metadata = None


class SessionOpen(StrictModel):
    """An open-queue message that asks a worker with room to host a session."""

    session: SessionSpec


Op = Literal["exec", "write", "read", "close"]


class Call(StrictModel):
    """One tool call, on the hosting worker's inbox. `seq` numbers a session's calls from 1;
    a call whose seq was answered already gets its recorded reply again, and never runs
    twice. `reply_url` lets a worker that no longer hosts the session say so."""

    session_id: SessionId
    reply_url: str
    seq: int = Field(ge=1)
    epoch: int = Field(default=0, ge=0, description="the session's failovers when it was sent")
    op: Op
    commands: list[Argv] = Field(default_factory=list, max_length=MAX_STEP_COMMANDS)
    files: Files = Field(default_factory=dict)
    path: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class StepAside(StrictModel):
    """On a worker's inbox, after a failover: a host of an earlier epoch of the session ends
    it (the client took it for lost and reopened it elsewhere)."""

    session_id: SessionId
    epoch: int = Field(ge=1, description="the session's epoch now")


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
    """A reply-queue message: the session is open (on which inbox), a call's result, a
    worker's sign of life while a call runs (the client fails over when these stop), or the
    worker no longer hosts it (`released`: idle under rlimit, its task freed for other work;
    the client reopens it from its checkpoint on its next call)."""

    kind: Literal["opened", "alive", "result", "failed", "released"]
    session_id: str
    epoch: int = Field(default=0, ge=0, description="the session's epoch on the sending host")
    seq: int = 0
    inbox_url: str | None = Field(default=None, description="opened: where its calls go")
    stored_bytes: int = Field(
        default=0, ge=0, description="result, released: the checkpoint bytes stored so far"
    )
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
