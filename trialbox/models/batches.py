"""The messages of a batch: one Rollout execution carrying many samples (docs/batches.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trialbox.models.common import StrictModel
from trialbox.models.jobs import StepError
from trialbox.models.sample import RequestId

# An execution's name: 80 characters of letters, digits, '-' and '_' (StartExecution).
BatchId = str


class BatchInput(StrictModel):
    """The Rollout execution's input: where its requests are, and their ids (for Settle)."""

    batch_id: BatchId = Field(pattern=r"^[A-Za-z0-9_-]{1,80}$")
    requests_uri: str = Field(description="S3: the batch's RolloutInputs, a JSON list")
    request_ids: list[RequestId] = Field(min_length=1)


class BatchWork(StrictModel):
    """A work-queue message: one sample of a batch. No task token: the sample's liveness is
    its claim's lease (trialbox.pipeline.claims), its answer a Finished message."""

    kind: Literal["job"] = "job"
    batch_id: BatchId
    request_id: RequestId
    job_uri: str
    budget_s: int = Field(gt=0, description="the run's own deadline: its claim cannot outlive it")
    content_sha256: str | None = Field(
        default=None, description="the request's content: its result records it (reuse check)"
    )


class Finished(StrictModel):
    """A finish-queue message, from the worker to the finisher: the sample's run ended, or it
    was never run (cancelled, lost past its retries, already finished)."""

    batch_id: BatchId
    request_id: RequestId
    job_uri: str
    outcome: Literal["report", "failure", "not_run"]
    report_uri: str | None = Field(default=None, description="outcome report: the run report")
    error: str | None = Field(
        default=None,
        description="the error class (failure: Sandbox.Error; not_run: Sandbox.Lost); none "
        "for a sample not run whose result is another's to write (cancelled, finished)",
    )
    cause: str | None = Field(default=None, description="why, in words")
    worker: str | None = None
    attempt: int = Field(default=0, ge=0, description="lost sandboxes before this run")
    started_at: float | None = Field(default=None, description="epoch s: a worker took the job")
    finished_at: float | None = Field(default=None, description="epoch s: its run ended")
    content_sha256: str | None = Field(default=None, description="as the BatchWork's")


class BatchRun(StrictModel):
    """The Run step's payload: the execution's input, and the token it waits on."""

    batch: BatchInput
    token: str = Field(min_length=1)


class BatchSettle(StrictModel):
    """The Settle step's payload: the execution's input, and the error that ended Run."""

    batch: BatchInput
    error: StepError
