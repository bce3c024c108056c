"""Every moto patch the twin needs, in one place. Each names the moto 5.2.5 defect it works
around; tests/local/test_patches.py fails if a patch stops being needed or stops working."""

from __future__ import annotations

import copy
import email.parser
import functools
import http.client
import inspect
import io
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core import responses as moto_responses
from moto.core.exceptions import AWSError
from moto.core.responses import EmptyResult
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.moto_server import threaded_moto_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler
from moto.sqs import models as sqs_models
from moto.stepfunctions.parser import models as sfn_models
from moto.stepfunctions.parser.asl.component.common.path import result_path
from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import (
    ResourceCondition,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (  # noqa: E501
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.eval.callback.callback import (
    CallbackConsumerTimeout,
    CallbackEndpoint,
)
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.utils import boto_client, json_path
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.responses import StepFunctionResponse

Invoke = Callable[[str, bytes], tuple[bool, bytes]]

_original_invoke = LambdaSimpleBackend.invoke
_original_setup_heartbeat = CallbackEndpoint.setup_heartbeat_endpoint
_original_notify_heartbeat = CallbackEndpoint.notify_heartbeat
_original_boto_client_for = boto_client.boto_client_for
_original_entrypoint = ExecutionWorker._get_evaluation_entrypoint
_original_backend_for_host = DomainDispatcherApplication.get_backend_for_host
_original_send_task_failure = StepFunctionResponse.send_task_failure
_original_eval_execution = StateTaskServiceCallback._eval_execution
# The names the JSONPath parsers moto's interpreter calls are imported as, by module, and
# those parsers (parse_each_json_path_once).
_JSON_PATH_NAMES: dict[str, dict[str, Any]] = {
    "json_path": vars(json_path), "result_path": vars(result_path),
}  # fmt: skip
_original_json_path_parsers = {m: names["parse"] for m, names in _JSON_PATH_NAMES.items()}
# The names moto's Step Functions backend raises its exceptions by.
_SFN_ERRORS: dict[str, Any] = vars(sfn_models)
_original_task_does_not_exist = _SFN_ERRORS["TaskDoesNotExist"]
# DynamoDB's table operations, each run whole under one lock (isolate_dynamodb_transactions).
_DYNAMODB_OPERATIONS = (
    "put_item", "get_item", "query", "scan", "update_item", "delete_item", "transact_write_items",
)  # fmt: skip
_original_dynamodb = {name: getattr(DynamoDBBackend, name) for name in _DYNAMODB_OPERATIONS}
# The clock moto's SQS reads (read_the_sqs_clock_directly), by the names it imported it as.
_SQS_NAMES: dict[str, Any] = vars(sqs_models)
_original_sqs_clock = (_SQS_NAMES["unix_time"], _SQS_NAMES["unix_time_millis"])
_dynamodb_lock = threading.RLock()  # a transaction's own puts and deletes take it again
# The `copy` module moto's DynamoDB backend copies a transaction's tables with.
_DYNAMODB_NAMES: dict[str, Any] = vars(dynamodb_models)
# The name moto's responses find an action's method by (find_each_action_by_a_set).
_RESPONSES_NAMES: dict[str, Any] = vars(moto_responses)
_original_method_names = _RESPONSES_NAMES["method_names_from_class"]
_original_parse_headers = http.client.parse_headers


class TaskDoesNotExist(AWSError):
    """What a late answer to a timed-out attempt's token gets (moto's check for a timed-out
    one tests the wrapper, never the timeout it wraps, so TaskTimedOut is never raised); moto's
    own cannot be raised: it requires a message its raise sites never give."""

    TYPE = "TaskDoesNotExist"
    STATUS = 400

    def __init__(self) -> None:
        super().__init__("Task Does Not Exist")


def route_lambda_invocations(invoke: Invoke) -> None:
    """Defect: with `lambda.use_docker: False`, moto's Lambda echoes the payload back instead
    of running anything. The twin routes each invoke to the real handler; an unhandled error
    sets `x-amz-function-error` so Step Functions' Retry/Catch see its errorType, as on AWS."""

    def patched(
        self: Any, function_name: str, qualifier: Any, body: Any, headers: Any, response: Any
    ) -> bytes:
        name = function_name.rsplit(":function:", 1)[-1].split(":", 1)[0]
        ok, payload = invoke(name, body if isinstance(body, bytes) else str(body or "").encode())
        if not ok:
            response["x-amz-function-error"] = "Unhandled"
        return payload

    LambdaSimpleBackend.invoke = patched  # type: ignore[method-assign,assignment]


def keep_early_callbacks() -> None:
    """Defect: a SendTaskSuccess that arrives before the heartbeat endpoint exists is lost (the
    task then fails with a heartbeat timeout). After setting the endpoint up, notify it if an
    outcome is already there."""

    def patched(self: CallbackEndpoint, heartbeat_seconds: int) -> Any:
        endpoint = _original_setup_heartbeat(self, heartbeat_seconds)
        if self.get_outcome() is not None:
            endpoint.notify()  # type: ignore[no-untyped-call]
        return endpoint

    CallbackEndpoint.setup_heartbeat_endpoint = patched  # type: ignore[method-assign]


def accept_early_heartbeats() -> None:
    """Defect: a SendTaskHeartbeat that arrives before the heartbeat endpoint exists (the worker
    took the message as soon as it was sent) answers InvalidToken, though the token is live.
    The worker then drops the job as stale and the execution waits out its heartbeat. On AWS
    the token is valid from the moment the message is sent: accept the heartbeat (the clock
    starts when the endpoint is set up, which is what a heartbeat would have done)."""

    def patched(self: CallbackEndpoint) -> bool:
        if self._heartbeat_endpoint is None:
            return True
        return bool(_original_notify_heartbeat(self))

    CallbackEndpoint.notify_heartbeat = patched  # type: ignore[method-assign]


def keep_failure_causes() -> None:
    """Defect: moto's SendTaskFailure handler passes `error` on and drops `cause`, so a
    `sandbox_error` loses its reason (the worker's "OSError: No space left on device"). The
    backend takes a cause: pass it on."""

    def patched(self: StepFunctionResponse) -> Any:
        backend = self.stepfunction_backend
        failure: dict[str, Any] = {"error": self._get_param("error")}
        # Only the executing backend (execute_state_machine on) keeps a cause at all.
        if "cause" in inspect.signature(backend.send_task_failure).parameters:
            failure["cause"] = self._get_param("cause")
        backend.send_task_failure(self._get_param("taskToken"), **failure)
        return EmptyResult()

    StepFunctionResponse.send_task_failure = patched  # type: ignore[method-assign]


def new_token_per_attempt() -> None:
    """Defects: moto makes a waitForTaskToken state's token once, when the state starts, and
    every Retry attempt sends that same token again; and the token of an attempt that timed out
    or failed stays live. So an attempt that timed out (States.Timeout or
    States.HeartbeatTimeout) could still be heartbeaten and answered by its worker after its
    deadline: the answer completed the retry, and a job that outlived its Execute step scored
    as if it had not; a job sent again after a lapse (the Rollout's Catch back into Execute)
    ran once per lapsed message. On AWS each attempt has a token of its own, and the token of
    an attempt that ended answers TaskTimedOut. Give each retry a new token, and time out an
    attempt's token once the attempt ends unanswered (its answers then get TaskDoesNotExist,
    its heartbeats TaskTimedOut: gone, to the worker, either way). Its tests, needed and
    working: tests/e2e/test_execute_budget.py, and tests/e2e/test_burst.py (a job sent again
    after lapses runs once)."""
    _SFN_ERRORS["TaskDoesNotExist"] = TaskDoesNotExist

    def patched(self: Any, env: Environment) -> Any:
        context: dict[str, Any] = env.states.context_object.context_object_data  # type: ignore[assignment]
        waits = self.resource.condition == ResourceCondition.WaitForTaskToken
        token = None
        if waits and context.get("Task"):
            if (context.get("State") or {}).get("RetryCount", 0):
                token = env.states.context_object.update_task_token()
                env.callback_pool_manager.add(token)
            else:
                token = context["Task"]["Token"]
        try:
            return _original_eval_execution(self, env)
        except Exception:
            ended = env.callback_pool_manager.get(token) if token else None
            if ended is not None and ended.get_outcome() is None:
                ended.report(CallbackConsumerTimeout())
            raise

    StateTaskServiceCallback._eval_execution = patched  # type: ignore[method-assign]


_clients: dict[tuple[str, str], Any] = {}
_clients_lock = threading.Lock()


def _reused_client(region: str, service: str, state_credentials: Any = None) -> Any:
    with _clients_lock:
        if (region, service) not in _clients:
            _clients[region, service] = _original_boto_client_for(region, service)
        return _clients[region, service]


def reuse_service_clients() -> None:
    """Defect (cost): moto's interpreter builds a new botocore client for every service call a
    Task state makes (each Lambda invoke, each sendMessage): about a quarter of the services
    process's CPU under load. Keep one client per (region, service); a built client is
    thread-safe. The call sites import the function by name, so each one is rebound."""
    _rebind(_original_boto_client_for, _reused_client)


@functools.lru_cache(maxsize=32)
def _parsed(definition: str) -> EvalComponent | None:
    """The definition's program, parsed once; None for one with a Parallel or Map, whose
    components hold a run's state (each execution parses its own)."""
    if {"Parallel", "Map"} & _kinds(json.loads(definition)):
        return None
    return AmazonStateLanguageParser.parse(definition)[0]


def _kinds(value: Any) -> set[str]:
    """Every state type a definition (its JSON, decoded) declares, nested ones too."""
    if isinstance(value, list):
        return set().union(*map(_kinds, value))
    if not isinstance(value, dict):
        return set()
    found = {value["Type"]} if isinstance(value.get("Type"), str) else set()
    return found.union(*map(_kinds, value.values()))


def _entrypoint(self: Any) -> EvalComponent:
    shared = _parsed(self._evaluation_details.state_machine_details.definition)
    return _original_entrypoint(self) if shared is None else shared


def parse_each_definition_once() -> None:
    """Defect (cost): moto parses a state machine's definition (ANTLR, then its components)
    again for every execution: a fifth of the services process's CPU under load. A parsed
    definition's components keep no execution's state (that is the Environment's), except a
    Parallel's or Map's: parse each other definition once and share its program."""
    ExecutionWorker._get_evaluation_entrypoint = _entrypoint  # type: ignore[method-assign]


@functools.lru_cache(maxsize=1024)
def _json_path(module: str, path: str) -> Any:
    return _original_json_path_parsers[module](path)


def parse_each_json_path_once() -> None:
    """Defect (cost): moto's interpreter builds a new jsonpath_ng parser, which builds ply's
    parsing tables again, for every JSONPath it evaluates (each InputPath, ResultPath and
    `.$` parameter of every state of every execution): about a tenth of the services
    process's CPU. A parsed path is a tree its `find` only reads, and a definition's paths
    are few: parse each once. (Two parsers, jsonpath_ng's and its extended one, each keep
    their own.)"""
    for module, names in _JSON_PATH_NAMES.items():
        names["parse"] = functools.partial(_json_path, module)


_hosts: dict[str | None, Any] = {}


def _backend_for_host(self: Any, host: str | None) -> Any:
    if host not in _hosts:
        _hosts[host] = _original_backend_for_host(self, host)
    return _hosts[host]


def route_each_host_once() -> None:
    """Defect (cost): the moto server finds a request's backend by listing its own package
    directory (a stat of each of ~150 entries) and then matching its URL patterns, on every
    request: about a tenth of the services process's CPU. The answer for a host never
    changes: find it once per host."""
    DomainDispatcherApplication.get_backend_for_host = _backend_for_host  # type: ignore[method-assign]


class _Drained(io.BufferedIOBase):
    """What werkzeug's after-response drain reads: nothing, since the body was read whole
    before the application ran."""

    def read(self, size: int | None = -1) -> bytes:
        return b""


class _KeepAliveHandler(MotoRequestHandler):
    """Reads a request's body whole (its Content-Length) before moto runs, so that nothing of
    it is left on the connection, and then keeps the connection for the client's next
    request. A chunked body, or a length that is not one, is left to werkzeug, which closes
    the connection after it."""

    disable_nagle_algorithm = True  # the headers and the body are two writes
    _kept: Any = None  # the connection's reader while werkzeug's drain reads _Drained

    def make_environ(self) -> Any:
        environ = super().make_environ()
        length = environ.get("CONTENT_LENGTH") or "0"
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if not chunked and length.isdigit():  # else werkzeug's way, and a closed connection
            environ["wsgi.input"] = io.BytesIO(self.rfile.read(int(length)))
            self._kept, self.rfile = self.rfile, _Drained()
        return environ

    def run_wsgi(self) -> None:
        try:
            super().run_wsgi()
        finally:
            if self._kept is not None:
                self.rfile, self._kept = self._kept, None

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "connection" and value.lower() == "close" and self._kept:
            return  # werkzeug closes every connection; this one has nothing left to drain
        super().send_header(keyword, value)


def keep_connections_alive() -> None:
    """Defect (cost): werkzeug's server closes every connection after one response (it
    cannot drain a body the application did not read), so each of the ~30 calls a sample
    makes opened a TCP connection and started a server thread: about a quarter of a call's
    CPU, both sides counted (GetItem 3.5 -> 2.7 ms, PutObject 5.3 -> 3.3 ms with the patch).
    Read the body before moto runs and keep the connection, as AWS's endpoints do. Must run
    before the server starts."""
    threaded_moto_server.MotoRequestHandler = _KeepAliveHandler  # type: ignore[attr-defined]


@functools.cache
def _method_names(clazz: type) -> frozenset[str]:
    return frozenset(_original_method_names(clazz))


def find_each_action_by_a_set() -> None:
    """Defect (cost): moto finds the method of a request's action by listing every function
    of its responses class (inspect.getmembers: a sort of a few hundred members) on every
    request: about a twelfth of a GetItem's CPU in the services process. A class's functions
    do not change once it is defined: list them once per class."""
    _RESPONSES_NAMES["method_names_from_class"] = _method_names


# A line the email parser takes as one header, whole: a name of printable ASCII but ':', a
# colon, a value with no CR or LF (it splits lines at a bare CR too), then the line's end.
_HEADER_LINE = re.compile(r"([\041-\071\073-\176]+):[ \t]*([^\r\n]*)\r?\n?")


def _parse_headers(fp: Any, _class: type = http.client.HTTPMessage) -> Any:
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]
    message = _class()
    for raw in lines[:-1]:  # the last is the empty line that ends them
        header = _HEADER_LINE.fullmatch(raw.decode("iso-8859-1"))
        if header is None:  # folded, malformed: as the email parser does it
            return _parsed_by_email(lines, _class)
        message[header[1]] = header[2]
    if message.get_content_maintype() in ("multipart", "message"):  # a payload it parses
        return _parsed_by_email(lines, _class)
    message.set_payload("")
    return message


def _parsed_by_email(lines: list[bytes], _class: type) -> Any:
    text = b"".join(lines).decode("iso-8859-1")
    return email.parser.Parser(_class=_class).parsestr(text)


def parse_headers_directly() -> None:
    """Defect (cost): http.client parses every request's and response's headers with the
    email package's feed parser (a general RFC 2822 parser: a quarter of a GetItem's
    request handling in werkzeug's server, before moto runs). Lines of one `name: value`
    each are read directly into the same message class; anything else (a folded or
    malformed line, a bare CR, a multipart or message type) still goes to the email parser:
    the same headers and payload as it gives.
    For the services process only: http.server and urllib3 (Step Functions' own calls)
    read headers through http.client.parse_headers."""
    http.client.parse_headers = _parse_headers  # type: ignore[assignment]


def _unix_time(dt: Any = None) -> float:
    return time.time() if dt is None else _original_sqs_clock[0](dt)


def _unix_time_millis(dt: Any = None) -> float:
    return time.time() * 1000.0 if dt is None else _original_sqs_clock[1](dt)


def read_the_sqs_clock_directly() -> None:
    """Defect (cost): moto's SQS builds every attribute of a queue (its three message counts,
    each a scan of its messages) for every message sent, only to read
    ContentBasedDeduplication, and twice per name a GetQueueAttributes asks for. Each message
    scanned asks the clock by datetime arithmetic (utcnow minus the epoch): with a few hundred
    sessions' opens in the queue, one SendMessageBatch of 10 took 26 ms. That clock is
    time.time() by a long way round: read it directly (still a scan, 15 times cheaper)."""
    _SQS_NAMES.update(unix_time=_unix_time, unix_time_millis=_unix_time_millis)


def _rebind(old: Any, new: Any) -> None:
    import moto.stepfunctions.parser.asl.parse.asl_parser  # noqa: F401  (imports every call site)

    for name, module in list(sys.modules.items()):
        if (
            name.startswith("moto.stepfunctions.parser.")
            and vars(module).get("boto_client_for") is old
        ):
            module.boto_client_for = new  # type: ignore[attr-defined]


def isolate_dynamodb_transactions() -> None:
    """Defect: moto's TransactWriteItems is neither atomic nor isolated under concurrent
    requests. It copies every table it touches before it starts, and a cancelled transaction
    puts the copies back, undoing what other requests wrote meanwhile (a release's marker
    delete and count decrement, say); a request in between sees half a transaction. The
    twin serves requests on threads, so under load the admission table's in-flight count
    drifted from its markers: a count of 1 with no marker left a one-slot pool full for good
    (a CI run's fargate tests: every job after it waited in the requests queue). On AWS a
    transaction is all or nothing, and serializable with single-item reads and writes. Run
    each table operation whole, under one lock (the services process is one interpreter: the
    GIL serializes them anyway).

    Defect 2: that copy is of the whole table, every item, on every transaction: its cost
    grows with the table, and a 1,000-sample run's transactions on the results and admission
    tables spent more of the twin's CPU than any other operation. Under the lock nothing else
    writes, so a transaction keeps a copy of only the items it names, and a cancelled one puts
    those back. Its tests: tests/local/test_patches.py."""
    for name, original in _original_dynamodb.items():
        wrapped = (
            _undo_only_the_named_items(original) if name == "transact_write_items" else original
        )

        def locked(self: Any, *args: Any, _original: Any = wrapped, **kwargs: Any) -> Any:
            with _dynamodb_lock:
                return _original(self, *args, **kwargs)

        setattr(DynamoDBBackend, name, locked)


class _TablesUncopied:
    """moto's DynamoDB module's `copy`, while a transaction runs: a table "copied" for the
    rollback is the table itself (the transaction keeps its named items instead)."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


_ItemKey = tuple[Table, DynamoType, DynamoType | None]


def _undo_only_the_named_items(original: Callable[..., Any]) -> Callable[..., Any]:
    def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> Any:
        before = {key: _item(key) for key in _named_items(self, transact_items)}
        _DYNAMODB_NAMES["copy"] = _TablesUncopied
        try:
            return original(self, transact_items)
        except BaseException:
            for (table, hash_key, range_key), item in before.items():
                if range_key is None:
                    table.items.pop(hash_key, None)
                    if item is not None:
                        table.items[hash_key] = item
                else:
                    table.items[hash_key].pop(range_key, None)
                    if item is not None:
                        table.items[hash_key][range_key] = item
            raise
        finally:
            _DYNAMODB_NAMES["copy"] = copy

    return transact_write_items


def _named_items(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> list[_ItemKey]:
    """The items a transaction names, as keys of their tables' items (the ones moto will
    refuse, a missing table or a malformed key, are left to its own errors)."""
    named = []
    for entry in transact_items:
        for op_type, op in entry.items():
            table = backend.tables.get(op.get("TableName", ""))
            key = op.get("Item") if op_type == "Put" else op.get("Key")
            if table is None or not isinstance(key, dict):
                continue
            try:
                hash_key = DynamoType(key[table.hash_key_attr])
                ranged = table.range_key_attr
                range_key = DynamoType(key[ranged]) if ranged is not None else None
            except (KeyError, TypeError):
                continue
            named.append((table, hash_key, range_key))
    return named


def _item(key: _ItemKey) -> Any:
    """A copy of the item under `key` as it is now; None: there is none."""
    table, hash_key, range_key = key
    found = table.items.get(hash_key)
    if range_key is not None:
        found = found.get(range_key) if found is not None else None
    return copy.deepcopy(found)


def undo() -> None:
    LambdaSimpleBackend.invoke = _original_invoke  # type: ignore[method-assign]
    CallbackEndpoint.setup_heartbeat_endpoint = _original_setup_heartbeat  # type: ignore[method-assign]
    CallbackEndpoint.notify_heartbeat = _original_notify_heartbeat  # type: ignore[method-assign]
    StepFunctionResponse.send_task_failure = _original_send_task_failure  # type: ignore[method-assign]
    StateTaskServiceCallback._eval_execution = _original_eval_execution  # type: ignore[method-assign]
    _SFN_ERRORS["TaskDoesNotExist"] = _original_task_does_not_exist
    _rebind(_reused_client, _original_boto_client_for)
    ExecutionWorker._get_evaluation_entrypoint = _original_entrypoint  # type: ignore[method-assign]
    _parsed.cache_clear()
    for module, names in _JSON_PATH_NAMES.items():
        names["parse"] = _original_json_path_parsers[module]
    _json_path.cache_clear()
    DomainDispatcherApplication.get_backend_for_host = _original_backend_for_host  # type: ignore[method-assign]
    _hosts.clear()
    for name, original in _original_dynamodb.items():
        setattr(DynamoDBBackend, name, original)
    _DYNAMODB_NAMES["copy"] = copy
    _SQS_NAMES.update(zip(("unix_time", "unix_time_millis"), _original_sqs_clock, strict=True))
    threaded_moto_server.MotoRequestHandler = MotoRequestHandler  # type: ignore[attr-defined]
    _RESPONSES_NAMES["method_names_from_class"] = _original_method_names
    _method_names.cache_clear()
    http.client.parse_headers = _original_parse_headers
