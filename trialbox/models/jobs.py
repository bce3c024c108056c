"""The pipeline's messages: what travels between its steps. Everything large goes by S3
reference: a Step Functions state holds at most 256 KiB."""

from __future__ import annotations

from pydantic import Field

from trialbox.models.common import Files, StrictModel
from trialbox.models.limits import Limits
from trialbox.models.sample import Argv, CheckpointId, ExecutionRequest, RequestId, Sample
from trialbox.models.task import Task


class StepError(StrictModel):
    """A step's error as Step Functions' Catch passes it on."""

    Error: str
    Cause: str | None = None


class RequestPointer(StrictModel):
    """A requests-queue message whose request sits in S3 (payloads over 128 KiB)."""

    request_id: RequestId
    payload_uri: str


class RolloutInput(StrictModel):
    """The Rollout execution's input: the request inline, or where it is."""

    request_id: RequestId
    request: ExecutionRequest | None = None
    payload_uri: str | None = None
    content_sha256: str | None = Field(
        default=None, description="the request's ExecutionRequest.content_sha256()"
    )


class JobSpec(StrictModel):
    """A resolved job: what the worker runs. Written by Prepare, read by worker and scorer."""

    request_id: RequestId
    sample_id: str | None = None
    task: Task
    files: Files = Field(default_factory=dict)
    commands: list[Argv] = Field(default_factory=list)
    grade: bool = True
    base_checkpoint: CheckpointId | None = None
    checkpoint: bool = False
    limits: Limits
    taskset_sha256: str | None = None
    queued_at: float | None = Field(default=None, description="epoch s: Prepare queued the job")

    def sample(self) -> Sample:
        return Sample(
            task_id=self.task.task_id,
            sample_id=self.request_id,
            files=self.files,
            commands=self.commands,
            metadata=None,
        )


class JobRef(StrictModel):
    """Prepare's small answer, kept in the execution state as `$.job`."""

    request_id: RequestId
    job_uri: str
    timeout_s: int = Field(description="the Execute step's TimeoutSeconds")
    heartbeat_s: int = Field(description="the Execute step's HeartbeatSeconds")
    admission_part: str = Field(description="the partition of the request's admission marker")
    attempt: int = Field(default=0, description="lost sandboxes before this Execute attempt")
    waited: int = Field(default=0, description="times its work message lapsed untaken")
    max_waits: int = Field(description="lapses untaken before it ends Execute.NotTaken")


class WorkMessage(StrictModel):
    """A work-queue message (built by the state machine)."""

    task_token: str
    request_id: RequestId
    job_uri: str
    attempt: int = Field(default=0, ge=0, description="Execute retries before this attempt")


class ExecutionDone(StrictModel):
    """What the worker sends with SendTaskSuccess."""

    report_uri: str
    worker: str | None = None
    started_at: float | None = Field(default=None, description="epoch s: a worker took the job")
    finished_at: float | None = Field(default=None, description="epoch s: its run ended")
    attempt: int = Field(default=0, ge=0, description="the work message's `attempt`")
    holds_slot: bool = Field(
        default=False, description="the worker took the request's admission slot: it gives it back"
    )
