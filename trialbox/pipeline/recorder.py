"""The Record step: every execution ends here, with a score or with the error that stopped it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field

from trialbox.models import ExecutionResult, Status, StrictModel
from trialbox.models.jobs import ScoreRef, StepError
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.record import failure_result, record
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.settings import FunctionSettings


class RecordInput(StrictModel):
    """The Rollout state as Record sees it (extra keys are the state machine's own)."""

    model_config = ConfigDict(extra="ignore")

    request_id: str
    content_sha256: str | None = None
    score: ScoreRef | None = None
    error: StepError | None = None
    job: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None
    request: dict[str, Any] | None = Field(default=None, exclude=True)


@dataclass(frozen=True)
class Recorded:
    """What Record did: whether this call wrote the terminal result (False: one existed), and
    the result's status (the sandbox_error rate metric counts written results only)."""

    written: bool
    status: Status


@dataclass
class Recorder:
    """The one terminal result of a request, its trace, and its slot given back."""

    table: ResultTable
    traces: ObjectStore
    admission: Admission

    def __call__(self, state: RecordInput, holder: str | None = None) -> Recorded:
        """`holder`: the worker whose sandbox held the request's slot, which it gives back
        with the result (a batch's finisher); None: only a slot no worker took (Record)."""
        if state.score is not None:
            result = ExecutionResult.model_validate_json(
                self.traces.get_bytes(state.score.result_uri)
            )
        else:
            error = state.error or StepError(Error="States.Unknown", Cause="no score and no error")
            done = state.execution or {}  # Execute answered; a later step failed
            attempt = done.get("attempt") if isinstance(done.get("attempt"), int) else None
            result = failure_result(state.request_id, error.Error, error.Cause, attempt)
        trace = {"state": json.loads(state.model_dump_json(exclude={"request"}))}
        written = record(
            result, self.table, self.traces, trace, content_sha256=state.content_sha256
        )
        # Its slot goes back once its one result is there (a retry of Record releases nothing).
        # A job a worker answered (Execute's answer names it) was taken by that worker, which
        # gives the slot back itself: Record, which releases only a slot no worker took, skips.
        if holder is not None or not (state.execution or {}).get("worker"):
            self.admission.release(state.request_id, worker=holder)
        return Recorded(written, result.status)


def recorder_for(settings: FunctionSettings, dynamodb: Any, s3: Any) -> Recorder:
    """A function's Recorder, from its settings (the functions that record results)."""
    return Recorder(
        table=ResultTable(
            dynamodb, settings.required("executions_table"), settings.result_ttl_days
        ),
        traces=ObjectStore(s3, settings.traces_bucket),
        admission=Admission(dynamodb, settings.required("admission_table")),
    )
