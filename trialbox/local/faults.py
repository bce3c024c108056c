"""Fault injection: the twin answers a share of the project's AWS calls as AWS does when it
throttles or fails, so that a trainer (and the pipeline itself) can be tried against a flaky
platform. Off by default; `LocalTwin(faults=0.1)`, `trialbox local up --faults 0.1`.

Each faulted call gets, at random, a throttle or a 5xx, with the error code and HTTP status
the service returns, in its protocol's error shape (botocore's standard retry mode retries
every one of them: its throttling codes, and any 500/502/503/504). A throttled call never
reaches moto, so it has no effect, as on AWS; a 5xx has none either, unless `applied` (off by
default) says which share of them moto carries out first, as AWS sometimes fails after the
work was done: the caller's retry then meets its own first attempt.

Only the project's principals are faulted: the SDK, the pool workers and the functions
(their handlers, and their event source mappings' polling). moto's own API, the twin's
setup, and the state machines' service integrations (moto's interpreter signs those as `ak`,
and does not retry a throttled integration as Step Functions does) never are.

Quotas scaled down: `LocalTwin(quotas={"states:StartExecution": (1.0, 4.0)})` throttles the
project's calls of one JSON-protocol operation beyond a token bucket (a refill a second, a
bucket), as AWS throttles past an account's rate quota (`benchmarks/model_vs_twin.py` checks
the scale model against it).

The services process reads its settings from the environment: TRIALBOX_TWIN_FAULTS (the
share, 0..1), TRIALBOX_TWIN_FAULTS_SEED (optional) and TRIALBOX_TWIN_QUOTAS (JSON:
{"service:Operation": [per_s, bucket]}).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trialbox.errors import TrialboxError
from trialbox.local import principals
from trialbox.local.requestlog import App, signer

ENV_FAULTS = "TRIALBOX_TWIN_FAULTS"
ENV_FAULTS_SEED = "TRIALBOX_TWIN_FAULTS_SEED"
ENV_FAULTS_APPLIED = "TRIALBOX_TWIN_FAULTS_APPLIED"
ENV_QUOTAS = "TRIALBOX_TWIN_QUOTAS"


@dataclass(frozen=True)
class Fault:
    code: str
    status: int
    message: str


THROTTLED = "Rate exceeded"
UNAVAILABLE = "Service Unavailable"
INTERNAL = "We encountered an internal error. Please try again."

# By signing name: (throttles, 5xx errors). Step Functions, DynamoDB and SQS speak the JSON
# protocol (SQS also the query protocol, which older clients use); S3 speaks REST-XML.
FAULTS: dict[str, tuple[tuple[Fault, ...], tuple[Fault, ...]]] = {
    "states": (
        (Fault("ThrottlingException", 400, THROTTLED),),
        (Fault("ServiceUnavailable", 503, UNAVAILABLE), Fault("InternalFailure", 500, INTERNAL)),
    ),
    "sqs": (
        (
            Fault("RequestThrottled", 400, THROTTLED),
            Fault("ThrottlingException", 400, THROTTLED),
        ),
        (Fault("InternalError", 500, INTERNAL), Fault("ServiceUnavailable", 503, UNAVAILABLE)),
    ),
    "dynamodb": (
        (
            Fault(
                "ProvisionedThroughputExceededException",
                400,
                "The level of configured provisioned throughput for the table was exceeded. "
                "Consider increasing your provisioning level with the UpdateTable API.",
            ),
            Fault("ThrottlingException", 400, THROTTLED),
        ),
        (Fault("InternalServerError", 500, "Internal server error"),),
    ),
    "s3": (
        (Fault("SlowDown", 503, "Please reduce your request rate."),),
        (Fault("InternalError", 500, INTERNAL), Fault("ServiceUnavailable", 503, UNAVAILABLE)),
    ),
}
# The JSON protocol's `__type`: DynamoDB and SQS prefix the code with their namespace
# (botocore reads the code after the `#`).
NAMESPACES = {"sqs": "com.amazonaws.sqs#", "dynamodb": "com.amazonaws.dynamodb.v20120810#"}


def share(value: float) -> float:
    """A valid share of calls to fault, or an error that says what is accepted."""
    if not 0.0 <= value <= 1.0:
        raise TrialboxError(
            f"faults must be a share of calls between 0 and 1 (0.1 faults one call in ten), "
            f"not {value}"
        )
    return float(value)


def faulted(key: str) -> bool:
    """Whether calls signed with `key` are the project's own: the SDK's, a worker's or a
    function's."""
    return key in (principals.SDK, principals.WORKER) or key.startswith(principals.FUNCTION_PREFIX)


Quotas = dict[str, tuple[float, float]]  # "service:Operation": (refill a second, bucket)


class RateQuota:
    """A token bucket: a refill a second up to a bucket, full at first (as AWS's quotas are)."""

    def __init__(self, per_s: float, bucket: float) -> None:
        if per_s <= 0 or bucket < 1:
            raise TrialboxError(
                f"a quota needs a refill above 0 a second and a bucket of at least 1 call, "
                f"not {per_s}/s and {bucket}"
            )
        self.per_s, self.bucket = per_s, bucket
        self.tokens, self.at = bucket, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.bucket, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def operation(environ: dict[str, Any]) -> str | None:
    """A JSON-protocol call's operation, from its X-Amz-Target (`AWSStepFunctions.StartExecution`:
    StartExecution)."""
    target = environ.get("HTTP_X_AMZ_TARGET")
    return target.rsplit(".", 1)[-1] if target else None


class Faults:
    """WSGI middleware around moto's server application."""

    def __init__(
        self,
        app: App,
        rate: float,
        seed: int | None = None,
        applied: float = 0.0,
        quotas: Quotas | None = None,
    ) -> None:
        """`applied`: the share of 5xx answers given after moto did the work (AWS can fail
        after a call took effect: the caller's retry meets its own first attempt). `quotas`:
        rate quotas scaled down, by "service:Operation" (its signing name)."""
        self.app = app
        self.rate = share(rate)
        self.applied = share(applied)
        self.quotas = {name: RateQuota(*limit) for name, limit in (quotas or {}).items()}
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        fault = self._draw(environ)
        if fault is None:
            return self.app(environ, start_response)
        service, fault_, after = fault
        if after:  # the work is done; its answer is lost
            answer = self.app(environ, lambda *_: None)
            for _ in answer:
                pass
            getattr(answer, "close", lambda: None)()
        else:
            _drain(environ)
        status, headers, body = render(service, fault_, query=_is_query(environ))
        if environ.get("REQUEST_METHOD") == "HEAD":  # a HEAD answer has no body
            body = b""
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]

    def _draw(self, environ: dict[str, Any]) -> tuple[str, Fault, bool] | None:
        """The fault for this call, if any, and whether moto does the work first."""
        signed = signer(environ)
        if signed is None or signed.service not in FAULTS or not faulted(signed.key):
            return None
        with self._lock:  # moto's server answers each request on a thread of its own
            limit = self.quotas.get(f"{signed.service}:{operation(environ)}")
            if limit is not None and not limit.take():  # past the quota: throttled
                return signed.service, FAULTS[signed.service][0][0], False
            if self._random.random() >= self.rate:
                return None
            throttles, errors = FAULTS[signed.service]
            fault = self._random.choice(throttles if self._random.random() < 0.5 else errors)
            after = fault.status >= 500 and self._random.random() < self.applied
            return signed.service, fault, after


def render(service: str, fault: Fault, query: bool = False) -> tuple[str, list[Any], bytes]:
    """The status line, headers and body AWS answers `fault` with."""
    request_id = str(uuid.uuid4())
    status = f"{fault.status} {_REASONS[fault.status]}"
    if service == "s3":
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{fault.code}</Code><Message>{fault.message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        return status, [("Content-Type", "application/xml"), ("x-amz-request-id", request_id)], body
    side = "Sender" if fault.status < 500 else "Receiver"
    if query:  # SQS's query protocol
        body = (
            '<?xml version="1.0"?><ErrorResponse><Error>'
            f"<Type>{side}</Type><Code>{fault.code}</Code><Message>{fault.message}</Message>"
            f"<Detail/></Error><RequestId>{request_id}</RequestId></ErrorResponse>"
        ).encode()
        return status, [("Content-Type", "text/xml"), ("x-amzn-RequestId", request_id)], body
    headers = [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-RequestId", request_id)]
    if service == "sqs":  # JSON with the query protocol's codes, for clients that map them
        headers.append(("x-amzn-query-error", f"{fault.code};{side}"))
    kind = NAMESPACES.get(service, "") + fault.code
    return status, headers, json.dumps({"__type": kind, "message": fault.message}).encode()


_REASONS = {400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}


def _is_query(environ: dict[str, Any]) -> bool:
    return not environ.get("HTTP_X_AMZ_TARGET") and environ.get("CONTENT_TYPE", "").startswith(
        "application/x-www-form-urlencoded"
    )


def _drain(environ: dict[str, Any]) -> None:
    """Read the unanswered request's body, so that the connection stays usable."""
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):
        stream.read()
    elif length := int(environ.get("CONTENT_LENGTH") or 0):
        stream.read(length)


def install(
    server: Any,
    rate: float,
    seed: int | None = None,
    applied: float = 0.0,
    quotas: Quotas | None = None,
) -> None:
    """Wrap a started ThreadedMotoServer's application (as requestlog.install does); install
    it before the request log, so that the log records the faults."""
    wsgi = getattr(server, "_server", None)
    if wsgi is None or not hasattr(wsgi, "app"):
        raise RuntimeError("moto's ThreadedMotoServer changed: no werkzeug server to wrap")
    wsgi.app = Faults(wsgi.app, rate, seed, applied, quotas)


def install_from_env(server: Any) -> None:
    """Fault injection as the environment sets it (TRIALBOX_TWIN_FAULTS, TRIALBOX_TWIN_QUOTAS);
    nothing if unset or 0."""
    rate = float(os.environ.get(ENV_FAULTS) or 0)
    quotas = {k: (v[0], v[1]) for k, v in json.loads(os.environ.get(ENV_QUOTAS) or "{}").items()}
    if rate or quotas:
        seed = os.environ.get(ENV_FAULTS_SEED)
        applied = float(os.environ.get(ENV_FAULTS_APPLIED) or 0)
        install(server, rate, int(seed) if seed else None, applied, quotas)


def environment(
    rate: float, seed: int | None = None, applied: float = 0.0, quotas: Quotas | None = None
) -> dict[str, str]:
    """The services process's environment for `rate` and `applied` (checked), `seed` and
    `quotas` (checked)."""
    for limit in (quotas or {}).values():
        RateQuota(*limit)
    env = {ENV_FAULTS: str(share(rate)), ENV_FAULTS_APPLIED: str(share(applied))}
    env |= {ENV_QUOTAS: json.dumps(quotas)} if quotas else {}
    return env | ({ENV_FAULTS_SEED: str(seed)} if seed is not None else {})
