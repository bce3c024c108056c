"""The AWS limits the pipeline relies on, as the twin enforces them: the values, the checks
and the errors AWS answers with. docs/twin-fidelity.md lists each with its AWS source and the
test that proves it; trialbox.local.limit_patches puts the checks into moto."""

from __future__ import annotations

import json
import re
from typing import Any

from trialbox.function_url import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES

# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html: "Maximum input or
# output size for a task, state, or execution: 256 KiB of data as a UTF-8 encoded string";
# the API reference's "Maximum length of 262144" (StartExecution input, SendTaskSuccess output).
SFN_PAYLOAD_BYTES = 262_144
# Same page: "Maximum execution history size: 25,000 events in a single execution history".
SFN_HISTORY_EVENTS = 25_000
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html: a name
# is 1-80 characters, without white space, brackets, wildcards, special or control characters.
SFN_NAME_CHARS = 80
_NAME_FORBIDDEN = re.compile(r"[\s<>{}\[\]?*\"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f]")
# https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html: "Invocation payload
# (request and response): 6 MB each for synchronous"; Lambda refuses a request over 6,291,456
# bytes and fails a response over 6,291,556 (trialbox.function_url holds both).
LAMBDA_REQUEST_BYTES = MAX_REQUEST_BYTES
LAMBDA_RESPONSE_BYTES = MAX_RESPONSE_BYTES
LAMBDA_RESPONSE_TOO_LARGE = (
    f"Response payload size exceeded maximum allowed payload size ({LAMBDA_RESPONSE_BYTES} bytes)."
)
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html: "The
# maximum item size in DynamoDB is 400 KB, which includes both attribute name binary length
# (UTF-8 length) and attribute values lengths (again binary length)".
DYNAMODB_ITEM_BYTES = 400 * 1024


class Refused(Exception):
    """A request AWS refuses, with the error code and HTTP status it answers (moto's side
    raises it as an AWSError: trialbox.local.limit_patches)."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def too_long(member: str, most: int, value: str | None = None) -> Refused:
    """A member outside its modelled length, as AWS's JSON APIs answer it."""
    shown = "" if value is None else f" '{value}'"  # a sensitive member is not echoed
    return Refused(
        "ValidationException",
        f"1 validation error detected: Value{shown} at '{member}' failed to satisfy "
        f"constraint: Member must have length less than or equal to {most}",
    )


class HistoryLimitExceeded(Exception):
    """An execution's history is full: the execution fails (States.Runtime)."""

    def __init__(self) -> None:
        most = SFN_HISTORY_EVENTS  # read now: a test lowers it
        super().__init__(f"The execution reached the maximum number of history events ({most}).")


class TemplateRefused(ValueError):
    """The template is one CloudFormation would not deploy."""


def check_execution_start(name: str | None, execution_input: str | None) -> None:
    """StartExecution's name and input, as AWS validates them before anything starts."""
    if name is not None:
        if len(name) > SFN_NAME_CHARS:
            raise too_long("name", SFN_NAME_CHARS, name)
        if not name or _NAME_FORBIDDEN.search(name):
            raise Refused("InvalidName", f"Invalid Name: '{name}'")
    if execution_input is not None and len(execution_input.encode()) > SFN_PAYLOAD_BYTES:
        raise too_long("input", SFN_PAYLOAD_BYTES)


def check_task_output(output: str | None) -> None:
    if output is not None and len(output.encode()) > SFN_PAYLOAD_BYTES:
        raise too_long("output", SFN_PAYLOAD_BYTES)


def state_payload_bytes(value: Any) -> int:
    """A state's input or output as Step Functions counts it: its JSON text in UTF-8 (a string
    output with its quotes)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def within_state_payload(value: Any) -> bool:
    return state_payload_bytes(value) <= SFN_PAYLOAD_BYTES


def check_lambda_request(payload: bytes) -> None:
    """Lambda's answer to a synchronous Invoke over 6 MB: HTTP 413, and the function never runs."""
    if len(payload) > LAMBDA_REQUEST_BYTES:
        message = (
            f"Request must be smaller than {LAMBDA_REQUEST_BYTES} bytes for the InvokeFunction "
            "operation"
        )
        raise Refused("RequestTooLargeException", message, 413)


def lambda_response_error(payload: bytes) -> bytes | None:
    """The function error Lambda reports instead of a response over its limit, if it is."""
    if len(payload) <= LAMBDA_RESPONSE_BYTES:
        return None
    error = {
        "errorMessage": LAMBDA_RESPONSE_TOO_LARGE,
        "errorType": "Function.ResponseSizeTooLarge",
    }
    return json.dumps(error).encode()


def check_event_source_mapping(
    mapping: str, visibility_s: float, function: str, timeout_s: float
) -> None:
    """Lambda refuses an SQS mapping whose queue's visibility timeout is below the function's
    timeout (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html), and
    CloudFormation fails the stack with Lambda's words."""
    if visibility_s < timeout_s:
        raise TemplateRefused(
            f'{mapping}: Resource handler returned message: "Invalid request provided: Queue '
            f"visibility timeout: {visibility_s:g} seconds is less than Function timeout: "
            f'{timeout_s:g} seconds" (function {function})'
        )
