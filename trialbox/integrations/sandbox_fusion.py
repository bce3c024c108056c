"""SandboxFusion's `POST /run_code`, answered by Trialbox's pool: verl's recipes (ReTool,
codecontests, apps) and the `sandbox-fusion` client switch with nothing but a URL.

A call is one ungraded execution request: the code (and the request's files, base64 as in
SandboxFusion) written to the workspace, the program run with its stdin, then each of
`fetch_files` read back base64. Status codes: 200 with SandboxFusion's body for every run the
pool finished, whatever the program did; 504 when the platform could not answer (the client's
queue full, no result in time, a sandbox error), because verl retries only 504 and scores any
other failure as a failed sample; 422 for a request that is not SandboxFusion's shape.
Every answer fits Lambda's 6 MB response (`fit_answer`): what does not fit is cut or left out,
and `truncated` names it.

`serve()` runs a `Proxy` on this machine, in front of the RunCode function URL: `trialbox
sandbox-fusion-proxy` for a deployed stack (the calls signed by the node's AWS credentials)
and `trialbox local up` for the twin's. The proxy answers Lambda's throttle (429) with a 504,
and refuses what the function URL would refuse (trialbox.function_url) with the same 4xx.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import uuid
from enum import StrEnum
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trialbox.constants import RUN_CODE_TIMEOUT_S
from trialbox.errors import InputError, TrialboxError, WaitTimeout
from trialbox.function_url import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    IntakeHandler,
    IntakeServer,
    Refused,
    event_body,
    event_json,
    payload_bytes,
)
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task
from trialbox.models.common import EncodedFile, RelPath
from trialbox.models.limits import LimitOverrides
from trialbox.models.report import CommandResult
from trialbox.pipeline.record import validation_message
from trialbox.sdk import Client

log = logging.getLogger("trialbox.integrations.sandbox_fusion")

# The languages whose toolchain the pool image has (Debian bookworm's python3 and bash): the
# twin's sandboxes bind the host's /usr, so a compiler found here may be missing on AWS.
PROGRAMS = {
    "python": ("main.py", ["python3", "main.py"]),
    "bash": ("main.sh", ["bash", "main.sh"]),
}
STDIN_FILE = ".stdin"
MAX_FETCH_FILES = 16
MAX_FETCH_BYTES = 3 * 1024 * 1024  # a fetched file, before base64
# And all of a call's fetched files together: a 6 MB answer has no room for more, and each
# byte carried through the result costs the platform's functions memory (up to 4 bytes a
# character once decoded, in each of the Recorder and Scorer's 512 MB).
MAX_FETCH_TOTAL_BYTES = MAX_FETCH_BYTES
# One command fetches them all, a line each in order: `=` and the file's base64, `-` for no
# regular file (a FIFO or a device would block the fetch until its timeout), `+` for a file
# over MAX_FETCH_BYTES by its size (a sparse file of 100 GB would take the whole timeout), `~`
# for one over what the files before it left of MAX_FETCH_TOTAL_BYTES.
FETCH = [
    "sh",
    "-c",
    f"left={MAX_FETCH_TOTAL_BYTES}; "
    'for p; do if ! test -f "./$p"; then echo -; continue; fi; size=$(stat -c %s "./$p"); '
    f'if test "$size" -gt {MAX_FETCH_BYTES}; then echo +; '
    'elif test "$size" -gt "$left"; then echo "~"; '
    'else left=$((left - size)); printf =; base64 -w0 "./$p"; echo; fi; done',
    "fetch",
]
ENDPOINT_ENV = "SANDBOX_FUSION_ENDPOINT"  # read by the sandbox-fusion client (at import)
# A call waits this long beyond its own timeouts (the queue, a sandbox's start), then answers
# 504: verl gives up on a call after compile_timeout + run_timeout + 10 s, and retries a 504.
WAIT_MARGIN_S = 8.0
# And this long for each MiB of output the call may carry (its streams, its fetched files):
# the work after the run (the result and trace stored, polled, read back) grows with it, and
# what the policy writes must never make the wait run out (a 504 verl retries, in place of the
# run's verdict). On the twin (2 cores, loaded), both streams full of \x01 took up to 13.8 s
# after the run ended: 1.7 s a MiB kept (tests/redteam/test_run_code_answer.py checks the
# headroom). The wait then passes verl's own (compile_timeout + run_timeout + 10 s) only when
# no result comes at all.
POST_RUN_S_PER_MIB = 2.0
FUNCTION_TIMEOUT_S = RUN_CODE_TIMEOUT_S  # on AWS; Endpoint.answer's `time_left_s` reads it
# An answer's JSON, as the function returns it (its body a JSON string within Lambda's JSON),
# fits Lambda's 6 MB with room for the status and headers around it.
MAX_ANSWER_BYTES = MAX_RESPONSE_BYTES - 4096
# The part of a function URL's event the proxy does not see (requestContext, AWS's headers).
EVENT_CONTEXT_BYTES = 4096
MAX_CONNECTIONS = 256

# The task a run_code call runs under: its limits are the ceiling a call may tighten. It is
# never graded (`grade: false`), so its test is never run.
RUN_CODE_TASK = Task(
    task_id="sandbox-fusion-run-code",
    hidden_tests={"tests/test_ungraded.py": "def test_ungraded():\n    pass\n"},
    grading={"command": ["python", "-m", "pytest", "-q", "tests"]},
    # verl asks for 1024 MiB by default; output is the program's, and each fetched file's
    # base64 (a function URL answers at most 6 MB in all: fit_answer cuts the rest).
    limits={
        "timeout_s": 60,
        "memory_mb": 1024,
        "output_bytes": MAX_FETCH_TOTAL_BYTES * 4 // 3 + 8 * MAX_FETCH_FILES,
    },
)


class RunCodeRequest(BaseModel):
    """SandboxFusion's request, as its client and verl send it (fields it does not know are
    ignored, as SandboxFusion ignores them)."""

    model_config = ConfigDict(extra="ignore")

    code: str
    language: str = "python"
    stdin: str | None = None
    compile_timeout: float = Field(default=10, ge=0, description="unused: no language compiles")
    run_timeout: float = Field(default=10, gt=0, description="capped at the pool's 60 s")
    memory_limit_MB: float = Field(
        default=-1, description="-1: the pool's default; at least 32, capped at 1024"
    )
    files: dict[str, str | None] = Field(default_factory=dict, description="path: base64")
    fetch_files: list[RelPath] = Field(
        default_factory=list, max_length=MAX_FETCH_FILES, description="workspace paths"
    )


class RunStatus(StrEnum):
    SUCCESS = "Success"
    FAILED = "Failed"
    SANDBOX_ERROR = "SandboxError"


class CommandRunStatus(StrEnum):
    FINISHED = "Finished"
    ERROR = "Error"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    cpu_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict, description="path: base64")
    truncated: list[str] = Field(
        default_factory=list,
        description="fields that are not whole: a stream cut to its beginning (by the run's "
        "output limit or to fit the 6 MB answer), a file left out (`files/<path>`)",
    )


class PlatformFailure(TrialboxError):
    """The pool could not answer a call (HTTP 504: verl and the client retry)."""


def execution_request(call: RunCodeRequest) -> ExecutionRequest:
    """The ungraded request that runs a call; InputError says what the caller must change."""
    if call.language not in PROGRAMS:
        raise InputError(
            f"language {call.language!r} is not offered: {', '.join(PROGRAMS)} (the pool "
            "image has no other toolchain)"
        )
    source, argv = PROGRAMS[call.language]
    files: dict[str, Any] = {
        path: EncodedFile(base64=content) for path, content in call.files.items() if content
    }
    files[source] = call.code
    command = list(argv)
    if call.stdin is not None:
        files[STDIN_FILE] = call.stdin
        command = ["sh", "-c", f'exec "$@" < {STDIN_FILE}', "sh", *argv]
    fetches = [[*FETCH, *call.fetch_files]] if call.fetch_files else []
    ceiling = RUN_CODE_TASK.limits
    limits: dict[str, float] = {"timeout_s": min(call.run_timeout, ceiling.timeout_s)}
    if call.memory_limit_MB > 0:  # SandboxFusion takes any size: here the pool's are the range
        limits["memory_mb"] = int(min(max(32, call.memory_limit_MB), ceiling.memory_mb))
    try:
        return ExecutionRequest(
            request_id=f"sandbox-fusion-{uuid.uuid4().hex}",
            task=RUN_CODE_TASK,
            files=files,
            commands=[command, *fetches],
            grade=False,
            limits=LimitOverrides.model_validate(limits),
            tags={"source": "sandbox-fusion"},
        )
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None


def response_for(call: RunCodeRequest, result: ExecutionResult) -> RunCodeResponse:
    """SandboxFusion's answer for a run the pool finished; PlatformFailure when it did not."""
    if result.loss_mask or not result.commands:
        raise PlatformFailure(result.error or result.feedback or f"status {result.status}")
    run = _run_result(result.commands[0])
    fetched, unfetched, left_out = _fetched(call.fetch_files, result.commands[1:])
    ok = run.status == CommandRunStatus.FINISHED and run.return_code == 0
    main = result.commands[0]
    cut = {"run_result.stdout": main.stdout_truncated, "run_result.stderr": main.stderr_truncated}
    return RunCodeResponse(
        status=RunStatus.SUCCESS if ok else RunStatus.FAILED,
        message="; ".join(unfetched),
        run_result=run,
        executor_pod_name=None,
        files=fetched,
        truncated=[name for name, truncated in cut.items() if truncated] + left_out,
    )


def _fetched(
    paths: list[str], commands: list[CommandResult]
) -> tuple[dict[str, str], list[str], list[str]]:
    """The fetch command's lines (FETCH): the files fetched, what `message` says of those
    that were not, and the `truncated` names of those left out by the total."""
    fetched: dict[str, str] = {}
    said: list[str] = []
    left_out: list[str] = []
    lines = commands[0].stdout.split("\n")[:-1] if commands else []  # the last is unfinished
    if commands and commands[0].stdout_truncated:  # only the lines before the cut are whole
        lines = lines[: next((i for i, ln in enumerate(lines) if ln.startswith("[")), 0)][:-1]
    for path, line in zip(paths, [*lines, *[""] * len(paths)], strict=False):
        if line.startswith("="):
            fetched[path] = line[1:]
        elif line == "+":
            said.append(f"{path}: over {MAX_FETCH_BYTES // 2**20} MiB, not fetched")
        elif line != "-":  # `~`, or no line: the fetch was cut short
            left_out.append(f"files/{path}")
            said.append(
                f"files/{path} left out: the fetched files take at most "
                f"{MAX_FETCH_TOTAL_BYTES // 2**20} MiB in all"
            )
    return fetched, said, left_out


def fit_answer(response: RunCodeResponse) -> str:
    """The answer's JSON, within MAX_ANSWER_BYTES as Lambda measures it (the JSON string
    inside the function's JSON: a byte the run's output replaced costs 7 bytes there). If it
    does not fit, the smallest of stdout, stderr and the fetched files are kept whole and the
    rest share what is left: a stream is cut to its beginning, a file that does not fit whole
    is left out (then kept after all, smallest first, if what the streams left takes it).
    `truncated` and `message` say which."""
    run = response.run_result or CommandRunResult(status=CommandRunStatus.FINISHED)
    streams = {"run_result.stdout": run.stdout or "", "run_result.stderr": run.stderr or ""}
    files = {f"files/{path}": data for path, data in response.files.items()}
    pieces = streams | files
    if sum(map(len, pieces.values())) <= MAX_ANSWER_BYTES:  # else it cannot fit: not measured
        answer = json.dumps(response.model_dump(mode="json"))
        if payload_bytes(answer) <= MAX_ANSWER_BYTES:
            return answer
    bare = response.model_copy(
        update={"run_result": run.model_copy(update=dict.fromkeys(("stdout", "stderr"), "")),
                "files": {}, "truncated": [*response.truncated, *pieces]},
    )  # fmt: skip
    # Room for `message` to name each piece (its name and 60 characters of words).
    notes = sum(_cost(name) + 60 for name in pieces)
    budget = MAX_ANSWER_BYTES - payload_bytes(json.dumps(bare.model_dump(mode="json"))) - notes
    costs = {name: _cost(value) for name, value in streams.items()}
    costs |= {name: _cost(value) + _cost(name) for name, value in files.items()}  # and its key
    shares = _shares(costs, budget)
    kept = [name for name in files if shares[name] == costs[name]]
    allowed = _shares({s: costs[s] for s in streams}, budget - sum(costs[f] for f in kept))
    cut = {name: _prefix(value, allowed[name]) for name, value in streams.items()}
    left = budget - sum(costs[f] for f in kept) - sum(_cost(v) for v in cut.values())
    for name in sorted(files.keys() - set(kept), key=lambda f: costs[f]):  # what streams left
        if costs[name] <= left:
            kept.append(name)
            left -= costs[name]
    shortened = [name for name in streams if len(cut[name]) < len(streams[name])]
    dropped = [name for name in files if name not in kept]
    said = [f"{name} cut to its first {len(cut[name])} of {len(streams[name])} characters"
            for name in shortened] + [f"{name} left out" for name in dropped]  # fmt: skip
    why = f"{', '.join(said)}: an answer must fit Lambda's 6 MB" if said else ""
    fitted = response.model_copy(
        update={
            "run_result": run.model_copy(update={k.split(".")[1]: v for k, v in cut.items()}),
            "files": {name.removeprefix("files/"): files[name] for name in files if name in kept},
            "truncated": list(dict.fromkeys([*response.truncated, *shortened, *dropped])),
            "message": "; ".join(m for m in [response.message, why] if m),
        }
    )
    return json.dumps(fitted.model_dump(mode="json"))


def _cost(text: str) -> int:
    """A string's bytes in the answer as Lambda measures it: escaped twice."""
    if text.isascii() and text.isprintable():  # base64, most output: counted, not encoded
        return len(text) + 6 + 3 * (text.count('"') + text.count("\\"))
    return payload_bytes(json.dumps(text))


def _shares(costs: dict[str, int], budget: int) -> dict[str, int]:
    """Each piece's allowance: the cheapest whole while they fit, each of the others an equal
    share of what they leave."""
    allowed, left = {}, max(0, budget)
    order = sorted(costs, key=lambda name: costs[name])
    for i, name in enumerate(order):
        allowed[name] = min(costs[name], left // (len(order) - i))
        left -= allowed[name]
    return allowed


def _prefix(text: str, allowance: int) -> str:
    """The longest beginning of `text` (found by shrinking) whose cost is within
    `allowance`."""
    n = len(text)
    while n and (cost := _cost(text[:n])) > allowance:
        n = min(n - 1, n * allowance // cost)
    return text[:n]


def _run_result(command: CommandResult) -> CommandRunResult:
    if command.timed_out:
        status = CommandRunStatus.TIME_LIMIT_EXCEEDED
    else:
        status = CommandRunStatus.FINISHED
    return_code = command.exit_code
    if return_code is None and command.signal:  # the shell's convention: 128 + the signal
        return_code = 128 + _signal_number(command.signal)
    stderr = command.stderr
    if command.oom_killed:
        stderr += "\nkilled: out of memory (memory_limit_MB)"
    return CommandRunResult(
        status=status,
        execution_time=command.wall_s,
        cpu_time=command.cpu_s,
        return_code=return_code,
        stdout=command.stdout,
        stderr=stderr,
    )


def _signal_number(name: str) -> int:
    """The runner names its kills as `signal.Signals` does ("SIGKILL")."""
    return int(signal.Signals.__members__.get(name, signal.SIGKILL))


def wait_s(call: RunCodeRequest, margin_s: float) -> float:
    """How long a call waits for its result: its runs' timeouts (each at most the task's
    limit), then `margin_s`, then the time to carry the most output it can have."""
    run_s = min(call.run_timeout, RUN_CODE_TASK.limits.timeout_s)
    runs = 2 if call.fetch_files else 1
    return run_s * runs + margin_s + POST_RUN_S_PER_MIB * carried_bytes(call) / 2**20


def carried_bytes(call: RunCodeRequest) -> int:
    """The most output a call's result carries: its program's two streams, the fetched
    files' base64."""
    return RUN_CODE_TASK.limits.output_bytes * (3 if call.fetch_files else 2)


async def run_code(
    client: Any, call: RunCodeRequest, request: ExecutionRequest, wait_margin_s: float
) -> RunCodeResponse:
    """One call (`request` is its `execution_request`) through an AsyncClient: SandboxFusion's
    answer, or PlatformFailure when no result came within `wait_s`. A call that missed its
    deadline is cancelled (its slot freed: verl sends it again), unless its result was
    recorded first, which is then the answer."""
    timeout = max(0.0, wait_s(call, wait_margin_s))
    [handle] = await client.submit([request])
    try:
        result = await handle.result(timeout)
    except WaitTimeout:
        try:
            await client.cancel([handle])
        except TrialboxError as exc:
            log.warning("cancelling %s failed: %s", request.request_id, exc)
        if not handle.done():
            raise PlatformFailure(f"no result within {timeout:.0f} s") from None
        result = await handle.result()
        if result.status == Status.CANCELLED:
            raise PlatformFailure(f"no result within {timeout:.0f} s; cancelled") from None
    if not result.commands and result.trace_uri and not result.loss_mask:
        # Over 300 KB, the table holds the result without its commands: the trace has them.
        trace = json.loads(await client.read_object(result.trace_uri))
        result = ExecutionResult.model_validate(trace["result"])
    return response_for(call, result)


class Endpoint:
    """The HTTP endpoint over a Client: at most `max_pending` calls at once, the rest 504."""

    def __init__(
        self, client: Client, max_pending: int | None = None, wait_margin_s: float = WAIT_MARGIN_S
    ) -> None:
        self.client = client
        self.wait_margin_s = wait_margin_s
        self.slots = threading.BoundedSemaphore(max_pending or 4 * client.concurrency)

    def answer(self, body: bytes, time_left_s: float | None = None) -> tuple[int, str]:
        """(HTTP status, JSON body) for a POST /run_code body; with `time_left_s` (a Lambda's
        remaining time), a call answers 504 a second before it runs out."""
        try:
            call = RunCodeRequest.model_validate_json(body)
            request = execution_request(call)  # refused here, before it takes a slot
        except ValidationError as exc:
            detail = _brief(validation_message(exc))
            return _json(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": detail})
        except InputError as exc:
            return _json(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": _brief(str(exc))})
        if not self.slots.acquire(blocking=False):
            return _failure("overloaded: too many calls at once; retry")
        margin = self.wait_margin_s
        if time_left_s is not None:
            margin = min(margin, time_left_s - 1 - wait_s(call, 0))
        try:
            coro = run_code(self.client.aio, call, request, margin)
            response = self.client.schedule(coro).result()
        except (PlatformFailure, TrialboxError) as exc:
            log.warning("run_code failed on the platform: %s", exc)
            return _failure(str(exc))
        finally:
            self.slots.release()
        return HTTPStatus.OK, fit_answer(response)


def _json(status: int, body: dict[str, Any]) -> tuple[int, str]:
    return status, json.dumps(body)


def _brief(text: str, limit: int = 4000) -> str:
    """An error's text, cut: it may quote the request's own values (a field name, a path),
    and an answer must fit Lambda's 6 MB whatever the request holds."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} characters more)"


def _failure(message: str) -> tuple[int, str]:
    body = RunCodeResponse(status=RunStatus.SANDBOX_ERROR, message=_brief(message))
    return _json(HTTPStatus.GATEWAY_TIMEOUT, body.model_dump(mode="json"))


class Proxy:
    """The trainer node's side of the AWS front: each call forwarded to the stack's RunCode
    function URL, signed with SigV4 (IAM auth) by the node's credentials. The function's
    answer passes through; a throttle (429), a Lambda error or no answer is 504, which verl
    retries; a refused signature (403) says which permission is missing."""

    def __init__(self, url: str, session: Any, timeout_s: float) -> None:
        self.url = url.rstrip("/") + "/run_code"
        self.session = session
        self.timeout_s = timeout_s
        self.http = urllib3.PoolManager(maxsize=64)

    def answer(self, body: bytes, time_left_s: float | None = None) -> tuple[int, str]:
        request = AWSRequest(
            method="POST", url=self.url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            _check_event_size(dict(request.headers.items()), body)
        except Refused as refused:
            return _json(refused.status, {"detail": refused.detail})
        credentials = self.session.get_credentials()
        if credentials is None:
            return _json(HTTPStatus.FORBIDDEN, {"detail": "no AWS credentials on this node"})
        SigV4Auth(
            credentials.get_frozen_credentials(), "lambda", self.session.region_name
        ).add_auth(request)
        try:
            answered = self.http.request(
                "POST", self.url, body=body, headers=dict(request.headers.items()),
                timeout=self.timeout_s, retries=False,
            )  # fmt: skip
        except urllib3.exceptions.HTTPError as exc:
            return _failure(f"the RunCode function did not answer: {exc}")
        return proxied(answered.status, answered.data.decode(errors="replace"))


def _check_event_size(headers: dict[str, str], body: bytes) -> None:
    """Refused (413) if the event the function URL makes of this request would be over
    Lambda's limit: AWS would refuse it, and a 504 for it would be retried."""
    text, encoded = event_body(headers, body)
    event = len(event_json({"headers": headers, "body": text, "isBase64Encoded": encoded}))
    if event + EVENT_CONTEXT_BYTES > MAX_REQUEST_BYTES:
        raise Refused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"this call is {event} bytes as a Lambda event (JSON escapes each quote, backslash "
            f"and control character), over the {MAX_REQUEST_BYTES} bytes a function URL "
            "takes: send less code, stdin or files",
        )


def proxied(status: int, body: str) -> tuple[int, str]:
    """The proxy's answer for the function URL's."""
    if status in (HTTPStatus.OK, HTTPStatus.UNPROCESSABLE_ENTITY, HTTPStatus.GATEWAY_TIMEOUT):
        return status, body
    if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:  # a 504 would be sent again, 3 times
        detail = f"the function URL refused the call as too large: {body[:500]}"
        return _json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"detail": detail})
    if status == HTTPStatus.FORBIDDEN:
        detail = (
            "the function URL refused this node's credentials: its role needs "
            "TrialboxClientPolicy (lambda:InvokeFunctionUrl and lambda:InvokeFunction)"
        )
        return _json(HTTPStatus.FORBIDDEN, {"detail": detail, "aws": body[:500]})
    return _failure(f"the RunCode function answered {status}: {body[:500]}")


class Answers(Protocol):
    def answer(self, body: bytes, time_left_s: float | None = None) -> tuple[int, str]: ...


def serve(
    endpoint: Answers,
    host: str = "127.0.0.1",
    port: int = 0,
    max_connections: int = MAX_CONNECTIONS,
) -> ThreadingHTTPServer:
    """Serve `POST /run_code` on a daemon thread; `server.server_address` says the port and
    `server.shutdown()` stops it. It takes what the function URL takes (trialbox.function_url)
    and at most `max_connections` at once: the next is a 504, which verl retries."""

    class Handler(IntakeHandler):
        def do_POST(self) -> None:
            try:
                if self.path.rstrip("/") != "/run_code":
                    raise Refused(HTTPStatus.NOT_FOUND, f"no route {self.path}: POST /run_code")
                body = self.read_body()
            except Refused as refused:
                self.refuse(refused)
                return
            status, answer = endpoint.answer(body)
            self.send_json(status, answer.encode())

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    busy = RunCodeResponse(
        status=RunStatus.SANDBOX_ERROR, message="overloaded: too many connections; retry"
    ).model_dump(mode="json")
    server = IntakeServer(
        (host, port), Handler, max_connections, (HTTPStatus.GATEWAY_TIMEOUT, busy)
    )
    threading.Thread(target=server.serve_forever, daemon=True, name="sandbox-fusion").start()
    return server


def url(server: ThreadingHTTPServer) -> str:
    """The endpoint's base URL (clients append /run_code)."""
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"
