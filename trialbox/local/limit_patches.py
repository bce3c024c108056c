"""The moto patches that make the twin refuse what AWS refuses (trialbox.local.limits holds the
limits and their sources). Each names the moto 5.2.5 gap it closes; tests/local/test_fidelity.py
fails if a patch stops being needed or stops working. `enforce()` installs them all."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.exceptions import AWSError
from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict
from moto.dynamodb.models.utilities import bytesize
from moto.stepfunctions.parser import quotas
from moto.stepfunctions.parser.asl.component.common.error_name.error_equals_decl import (
    ErrorEqualsDecl,
)
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
    StatesErrorName,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
    StatesErrorNameType,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task import StateTask
from moto.stepfunctions.parser.asl.eval.callback.callback import HeartbeatTimeoutError
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.eval.event.event_manager import EventManager
from moto.stepfunctions.responses import StepFunctionResponse

from trialbox.local import limits

Method = TypeVar("Method", bound=Callable[..., Any])

_original_start_execution = StepFunctionResponse.start_execution
_original_send_task_success = StepFunctionResponse.send_task_success
_original_set_item = LimitedSizeDict.__setitem__
_original_error_equals = ErrorEqualsDecl._eval_body
_original_add_event = EventManager.add_event
_original_within_quota = quotas.is_within_size_quota
_original_task_error = StateTask._from_error
# Terminal errors States.ALL does not match, in a Catch or a Retry
# (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html). Not
# States.Runtime, which AWS does not catch either: moto also reports its own failures as
# States.Runtime (a connection error to its own server), where AWS reports a service error
# that States.ALL catches.
UNCATCHABLE = frozenset({"States.DataLimitExceeded"})
_lambda_invoke: list[Any] = []  # LambdaSimpleBackend.invoke as it was before answer_refusals


def answered_as_aws(method: Method) -> Method:
    """`method`, with a limits.Refused raised as moto's AWSError: AWS's code and status."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except limits.Refused as refused:
            raise AWSError(str(refused), refused.code, refused.status) from None

    return wrapper  # type: ignore[return-value]


def validate_starts() -> None:
    """Gap: moto starts an execution with any name (81 characters, white space, `/`) and any
    input size. AWS validates both first: ValidationException for a name over 80 characters or
    an input over 262,144 bytes, InvalidName for a forbidden character."""

    @answered_as_aws
    def patched(self: StepFunctionResponse) -> Any:
        limits.check_execution_start(self._get_param("name"), self._get_param("input"))
        return _original_start_execution(self)

    StepFunctionResponse.start_execution = patched  # type: ignore[method-assign]


def validate_task_outputs() -> None:
    """Gap: moto takes a SendTaskSuccess output of any size; AWS answers ValidationException
    over 262,144 bytes."""

    @answered_as_aws
    def patched(self: StepFunctionResponse) -> Any:
        limits.check_task_output(self._get_param("output"))
        return _original_send_task_success(self)

    StepFunctionResponse.send_task_success = patched  # type: ignore[method-assign]


def count_state_payloads_as_aws() -> None:
    """Gap: moto counts a state's payload as `json.dumps` with spaces, a string one without its
    quotes, and refuses exactly 262,144 bytes. AWS counts the JSON text and refuses over it
    (States.DataLimitExceeded). The call sites import the check by name: each is rebound."""
    _rebind_quota(limits.within_state_payload)


def _rebind_quota(check: Any) -> None:
    import moto.stepfunctions.parser.asl.parse.asl_parser  # noqa: F401  (imports every call site)

    for name, module in list(sys.modules.items()):
        if name.startswith("moto.stepfunctions.parser.") and "is_within_size_quota" in vars(module):
            module.is_within_size_quota = check  # type: ignore[attr-defined]


def keep_terminal_errors_terminal() -> None:
    """Gap: moto's States.ALL matches every error. On AWS it does not match the terminal
    States.DataLimitExceeded: a task whose result is over the quota fails the execution,
    whatever its Catch says."""

    def patched(self: ErrorEqualsDecl, env: Environment) -> None:
        error = env.stack[-1]
        _original_error_equals(self, env)
        named = [e.error_name for e in self.error_names]
        if "States.ALL" in named and getattr(error, "error_name", None) in UNCATCHABLE:
            env.stack[-1] = False

    ErrorEqualsDecl._eval_body = patched  # type: ignore[method-assign]


def name_heartbeat_timeouts() -> None:
    """Gap: moto reports a lapsed heartbeat (HeartbeatSeconds) as States.Timeout, like a
    lapsed TimeoutSeconds. AWS reports States.HeartbeatTimeout
    (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html), and
    a Retry or Catch that names one does not match the other."""

    def patched(self: StateTask, env: Environment, ex: Exception) -> FailureEvent:
        event = _original_task_error(self, env, ex)
        if isinstance(ex, HeartbeatTimeoutError):
            heartbeat = StatesErrorName(typ=StatesErrorNameType.StatesHeartbeatTimeout)
            event.error_name = heartbeat  # type: ignore[misc]
            for details in cast(dict[str, dict[str, Any]], event.event_details or {}).values():
                details["error"] = heartbeat.error_name
        return event

    StateTask._from_error = patched  # type: ignore[method-assign]


def limit_history() -> None:
    """Gap: moto's execution history grows without end. AWS fails an execution when its history
    reaches 25,000 events."""

    def patched(self: EventManager, *args: Any, **kwargs: Any) -> int:
        event_type = kwargs.get("event_type", args[1] if len(args) > 1 else None)
        full = len(self._history_event_list) >= limits.SFN_HISTORY_EVENTS
        if full and not str(getattr(event_type, "value", event_type)).startswith("Execution"):
            raise limits.HistoryLimitExceeded()
        return _original_add_event(self, *args, **kwargs)

    EventManager.add_event = patched  # type: ignore[method-assign]


def limit_items_as_aws() -> None:
    """Gap: moto refuses an item over 405,000 bytes, below AWS's 400 KB (409,600 bytes):
    the twin would refuse items AWS stores. Same count as moto's, AWS's bound."""

    def patched(self: LimitedSizeDict, key: str, value: Any) -> None:
        def size(x: Any) -> int:
            return x.size() if type(x) is DynamoType else bytesize(str(x))

        current = sum(size(k) + size(v) for k, v in self.items() if k != key)
        if current + bytesize(key) + size(value) > limits.DYNAMODB_ITEM_BYTES:
            from moto.dynamodb.exceptions import ItemSizeTooLarge

            raise ItemSizeTooLarge
        dict.__setitem__(self, key, value)

    LimitedSizeDict.__setitem__ = patched  # type: ignore[method-assign]


def answer_lambda_refusals() -> None:
    """The twin's Lambda (trialbox.local.functions) refuses a request over 6 MB, as Lambda does
    before running anything; Invoke answers it as Lambda: RequestTooLargeException, HTTP 413.
    Wraps the invoke route_lambda_invocations installed."""
    _lambda_invoke[:] = [LambdaSimpleBackend.invoke]
    LambdaSimpleBackend.invoke = answered_as_aws(LambdaSimpleBackend.invoke)  # type: ignore[method-assign]


def enforce() -> None:
    """Every limit patch (after patches.route_lambda_invocations: it wraps that invoke)."""
    answer_lambda_refusals()
    validate_starts()
    validate_task_outputs()
    count_state_payloads_as_aws()
    keep_terminal_errors_terminal()
    name_heartbeat_timeouts()
    limit_history()
    limit_items_as_aws()


def undo() -> None:
    if _lambda_invoke:
        LambdaSimpleBackend.invoke = _lambda_invoke.pop()  # type: ignore[method-assign]
    StepFunctionResponse.start_execution = _original_start_execution  # type: ignore[method-assign]
    StepFunctionResponse.send_task_success = _original_send_task_success  # type: ignore[method-assign]
    LimitedSizeDict.__setitem__ = _original_set_item  # type: ignore[method-assign]
    ErrorEqualsDecl._eval_body = _original_error_equals  # type: ignore[method-assign]
    EventManager.add_event = _original_add_event  # type: ignore[method-assign]
    StateTask._from_error = _original_task_error  # type: ignore[method-assign]
    _rebind_quota(_original_within_quota)
