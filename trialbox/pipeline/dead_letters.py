"""The requests DLQ's consumer: a request whose message dead-lettered without an execution ever
starting (StartExecution failed on every receive: throttled, the service down) still ends with
one terminal result, a `sandbox_error` that names why. Its slot, if it was admitted, goes back.

What the dispatcher dead-letters on purpose (no request id to answer, an id reused for other
content) carries a `reason` attribute and is left alone: there is no result to write for it,
or its id's result belongs to the first content."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trialbox.models import Status, result_for
from trialbox.models.sample import REQUEST_ID
from trialbox.pipeline.admission import Admission
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

    def __call__(self, body: str, attributes: dict[str, Any]) -> DeadLetter:
        if REASON_ATTRIBUTE in attributes:
            return DeadLetter.LEFT
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
        request_id = raw.get("request_id") if isinstance(raw, dict) else None
        if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
            return DeadLetter.LEFT  # the dispatcher sends these itself; nothing to answer
        if self._started(request_id):
            return DeadLetter.ALREADY_ENDED  # its execution writes its one result
        message = (
            "the request dead-lettered before its execution could start (Step Functions' "
            "StartExecution failed on every delivery: see the dispatcher's logs)"
        )
        result = result_for(
            request_id,
            Status.SANDBOX_ERROR,
            error=message,
            feedback=f"sandbox error (not your code): {message}",
        )
        written = record(result, self.table, None)
        self.admission.release(request_id)
        return DeadLetter.RECORDED if written else DeadLetter.ALREADY_ENDED

    def _started(self, request_id: str) -> bool:
        arn = self.rollout_arn.replace(":stateMachine:", ":execution:", 1) + f":{request_id}"
        try:
            self.sfn.describe_execution(executionArn=arn)
        except self.sfn.exceptions.ExecutionDoesNotExist:
            return False
        return True


@dataclass
class EndedWithoutResult:
    """Whether an admitted request's execution is over without its result (stopped by hand,
    or Record's own fallback failed): the reaper's check of an old slot nobody holds. If so,
    the request gets its one `sandbox_error` result here first."""

    sfn: Any
    rollout_arn: str
    table: ResultTable

    def __call__(self, request_id: str) -> bool:
        arn = self.rollout_arn.replace(":stateMachine:", ":execution:", 1) + f":{request_id}"
        try:
            status = self.sfn.describe_execution(executionArn=arn)["status"]
        except self.sfn.exceptions.ExecutionDoesNotExist:
            return False  # not started yet: its message comes back, or the DLQ's consumer
        if status in ("RUNNING", "PENDING_REDRIVE"):
            return False
        message = f"the request's execution ended ({status}) without writing its result"
        result = result_for(
            request_id,
            Status.SANDBOX_ERROR,
            error=message,
            feedback=f"sandbox error (not your code): {message}",
        )
        record(result, self.table, None)
        return True
