"""The requests DLQ's consumer: a request whose message dead-lettered without an execution ever
starting (StartExecution failed on every receive: throttled, the service down) still ends with
one terminal result, a `sandbox_error` that names why. Its slot, if it was admitted, goes back.

What the dispatcher dead-letters on purpose (no request id to answer, an id reused for other
content) carries a `reason` attribute and is left alone: there is no result to write for it,
or its id's result belongs to the first content."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trialbox.keys import execution_arn
from trialbox.models import Status, result_for
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.batching import BatchStarter
from trialbox.pipeline.dispatch import recover
from trialbox.pipeline.record import record
from trialbox.pipeline.stores import ResultTable

REASON_ATTRIBUTE = "reason"  # set by the dispatcher on what it dead-letters itself


class DeadLetter(StrEnum):
    RECORDED = "recorded"  # a sandbox_error result written
    ALREADY_ENDED = "already_ended"  # its execution started after all, or it has its result
    LEFT = "left"  # dead-lettered on purpose by the dispatcher: nothing to write


@dataclass
class DeadLetters:
    sfn: Any
    rollout_arn: str
    table: ResultTable
    admission: Admission
    batches: BatchStarter | None = None  # a batch's sample: its batch writes its result

    def __call__(self, body: str, attributes: dict[str, Any]) -> DeadLetter:
        if REASON_ATTRIBUTE in attributes:
            return DeadLetter.LEFT
        _, request_id = recover(body)
        if request_id is None:
            return DeadLetter.LEFT  # the dispatcher sends these itself; nothing to answer
        if execution_status(self.sfn, self.rollout_arn, request_id) is not None:
            return DeadLetter.ALREADY_ENDED  # its execution writes its one result
        if self.batches is not None and self.batches.carried_by(request_id):
            return DeadLetter.ALREADY_ENDED  # its batch's execution does
        written = _sandbox_error(
            self.table,
            request_id,
            "the request dead-lettered before its execution could start (Step Functions' "
            "StartExecution failed on every delivery: see the dispatcher's logs)",
        )
        self.admission.release(request_id)
        return DeadLetter.RECORDED if written else DeadLetter.ALREADY_ENDED


@dataclass
class EndedWithoutResult:
    """Whether an admitted request's execution is over without its result (stopped by hand,
    or Record's own fallback failed): the reaper's check of an old slot nobody holds. If so,
    the request gets its one `sandbox_error` result here first."""

    sfn: Any
    rollout_arn: str
    table: ResultTable
    batch_arn: str | None = None

    def __call__(self, request_id: str, execution: str | None = None) -> bool:
        """`execution`: the name of the execution that carries it (its batch's, on the Batch
        state machine), if not its own."""
        batched = execution not in (None, request_id) and self.batch_arn is not None
        machine = self.batch_arn if batched and self.batch_arn else self.rollout_arn
        status = execution_status(self.sfn, machine, execution or request_id)
        if status in (None, "RUNNING", "PENDING_REDRIVE"):
            return False  # None: not started yet (its message comes back, or the DLQ's consumer)
        message = f"the request's execution ended ({status}) without writing its result"
        _sandbox_error(self.table, request_id, message)
        return True


def execution_status(sfn: Any, rollout_arn: str, request_id: str) -> str | None:
    """The request's execution's status; None when it never started."""
    try:
        answer = sfn.describe_execution(executionArn=execution_arn(rollout_arn, request_id))
    except sfn.exceptions.ExecutionDoesNotExist:
        return None
    return str(answer["status"])


def _sandbox_error(table: ResultTable, request_id: str, message: str) -> bool:
    """The request's one result, a masked `sandbox_error` naming why; False if it had one."""
    feedback = f"sandbox error (not your code): {message}"
    result = result_for(request_id, Status.SANDBOX_ERROR, error=message, feedback=feedback)
    return record(result, table, None)
