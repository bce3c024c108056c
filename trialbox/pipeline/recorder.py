"""The Record step: every execution ends here, with its run scored (trialbox.pipeline.score) or
with the error that stopped it. A batch's finisher records the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ConfigDict, Field, ValidationError

from trialbox.models import ExecutionResult, Status, StrictModel
from trialbox.models.jobs import ExecutionDone, StepError
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.record import failure_result, record, validation_message
from trialbox.pipeline.score import Scorer
from trialbox.pipeline.stores import ObjectStore, ResultTable, unreadable
from trialbox.settings import FunctionSettings

# A run's report that could not be scored: the request still ends, as a platform error.
SCORE_FAILED = "Score.Failed"


class RecordInput(StrictModel):
    """The Rollout state as Record sees it (extra keys are the state machine's own)."""

    model_config = ConfigDict(extra="ignore")

    request_id: str
    content_sha256: str | None = None
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

    def __call__(self, state: RecordInput) -> Recorded:
        """Record, the Rollout's last step: Execute's answer scored (`execution`: Record comes
        right after it; an `error` beside it is a lost attempt's, before the retry that
        answered), or else the error a step was caught with."""
        if state.execution is None:
            return self.record(state, None)
        try:
            done = ExecutionDone.model_validate(state.execution)
        except ValidationError as exc:  # an answer no worker of this stack sends
            cause = f"Execute's answer: {validation_message(exc)}"
            return self.record(
                state.model_copy(update={"error": StepError(Error=SCORE_FAILED, Cause=cause)}), None
            )
        return self.record(state, done)

    def record(
        self, state: RecordInput, done: ExecutionDone | None, holder: str | None = None
    ) -> Recorded:
        """The request's result: `done` (a worker's answer) scored, else `state.error`'s.
        `holder`: the worker whose sandbox held the request's slot, which it gives back with
        the result (a batch's finisher); None: only a slot no worker took (Record)."""
        if done is not None:
            result = self._scored(state, done)
        else:
            error = state.error or StepError(Error="States.Unknown", Cause="no run and no error")
            ran = state.execution or {}  # a batched sample's Finished names its attempt
            attempt = ran.get("attempt") if isinstance(ran.get("attempt"), int) else None
            result = failure_result(state.request_id, error.Error, error.Cause, attempt)
        trace = {"state": json.loads(state.model_dump_json(exclude={"request"}))}
        written = record(
            result, self.table, self.traces, trace, content_sha256=state.content_sha256
        )
        # Its slot goes back once its one result is there (a retry of Record releases nothing).
        # A slot the answering worker holds (Execute's answer says so) is that worker's to
        # give back: Record, which releases only a slot no worker took, skips it.
        if holder is not None or (state.execution or {}).get("holds_slot") is not True:
            self.admission.release(state.request_id, worker=holder)
        return Recorded(written, result.status)

    def _scored(self, state: RecordInput, done: ExecutionDone) -> ExecutionResult:
        """The run scored; a run that cannot be, ever, is Score.Failed. A read that failed
        for now (throttled, a timeout) raises: Record's retry, or the finish message's
        redelivery, scores it again."""
        job_uri = (state.job or {}).get("job_uri")
        try:
            if not isinstance(job_uri, str):
                raise ValueError("the state names no job_uri")
            return Scorer(self.traces).score(job_uri, done)
        except Exception as exc:  # the request still ends: its run could not be scored
            if isinstance(exc, (ClientError, BotoCoreError)) and not unreadable(exc):
                raise
            cause = f"{type(exc).__name__}: {exc}"
        return failure_result(state.request_id, SCORE_FAILED, cause, done.attempt)


def recorder_for(settings: FunctionSettings, dynamodb: Any, s3: Any) -> Recorder:
    """A function's Recorder, from its settings (the functions that record results)."""
    return Recorder(
        table=ResultTable(
            dynamodb, settings.required("executions_table"), settings.result_ttl_days
        ),
        traces=ObjectStore(s3, settings.traces_bucket),
        admission=Admission(dynamodb, settings.required("admission_table")),
    )
