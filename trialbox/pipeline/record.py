"""Terminal results: the table item (one per request id) and the trace object."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from trialbox.constants import (
    CONTENT_ATTRIBUTE,
    ERROR_REJECTED,
    ERROR_SANDBOX,
    LOST_SANDBOX_ERRORS,
    LOST_SANDBOX_RETRIES,
)
from trialbox.keys import trace_key
from trialbox.models import ExecutionResult, Status, result_for
from trialbox.pipeline.stores import ObjectStore, ResultTable

# DynamoDB items are capped at 400 KB; larger results are kept whole only in the trace.
MAX_INLINE_RESULT = 300_000


def validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(request)"
        parts.append(f"{field}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def failure_result(
    request_id: str, error: str, cause: str | None, attempt: int | None = None
) -> ExecutionResult:
    """A result for a request that never produced a scored result. `attempt`: the Execute
    attempt that answered (retries before it), when Execute succeeded and a later step failed."""
    status = Status.REJECTED if error == ERROR_REJECTED else Status.SANDBOX_ERROR
    detail, retries = _cause_message(cause)
    message = detail if status == Status.REJECTED else f"{error}: {detail}" if detail else error
    if attempt is not None:
        retries = attempt
    elif error in LOST_SANDBOX_ERRORS:  # caught only once the Execute retries ran out
        retries = LOST_SANDBOX_RETRIES
    elif error != ERROR_SANDBOX:
        retries = 0
    feedback = message if status == Status.REJECTED else f"sandbox error (not your code): {message}"
    result = result_for(request_id, status, error=message, feedback=feedback)
    return result.model_copy(update={"attempts": retries + 1})


def _cause_message(cause: str | None) -> tuple[str, int]:
    """(message, Execute retries before the failing attempt). Step Functions' Cause for a
    Lambda error is the JSON {errorMessage, errorType, ...}; the worker's for a Sandbox.Error
    is {errorMessage, attempt}."""
    if not cause:
        return "", 0
    try:
        parsed = json.loads(cause)
    except ValueError:
        return cause, 0
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        attempt = parsed.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            attempt = 0
        return str(parsed["errorMessage"]), attempt
    return cause, 0


def table_attributes(
    result: ExecutionResult, trace_uri: str | None, content_sha256: str | None = None
) -> dict[str, Any]:
    body = result.model_dump_json()
    if len(body) > MAX_INLINE_RESULT:
        trimmed = result.model_copy(update={"commands": [], "tests": result.tests[:200]})
        body = trimmed.model_dump_json()
    return {
        "status": result.status.value,
        "reward": result.reward,
        "loss_mask": result.loss_mask,
        "task_id": result.task_id,
        "sample_id": result.sample_id,
        "result_uri": trace_uri,
        "result": body,
        CONTENT_ATTRIBUTE: content_sha256,
    }


def record(
    result: ExecutionResult,
    table: ResultTable,
    traces: ObjectStore | None,
    trace: dict[str, Any] | None = None,
    *,
    content_sha256: str | None = None,
) -> bool:
    """Write the trace (if a store is given), then the one terminal item. False: it existed."""
    request_id = result.request_id
    assert request_id is not None
    trace_uri = None
    if traces is not None:
        trace_uri = traces.uri(trace_key(request_id))
        result = result.model_copy(update={"trace_uri": trace_uri})
        traces.put_json(
            trace_key(request_id), {"result": json.loads(result.model_dump_json()), **(trace or {})}
        )
    return table.put_terminal(request_id, table_attributes(result, trace_uri, content_sha256))
