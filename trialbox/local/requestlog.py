"""An opt-in log of the requests the twin's AWS side serves, one JSON line each: who called
(the access key id of its SigV4 credential, trialbox.local.principals), the service, and the
raw request facts that name the operation and its resource. Bodies are kept only for the JSON
protocol (an X-Amz-Target header) and the query protocol (a form), whose parameters live
there; the REST protocols (S3, Lambda) name theirs in the path, and their bodies are data.

Set TRIALBOX_TWIN_REQUEST_LOG=<path> in the environment of the process that starts the twin.
`calls` reads it back, each line as the operation it called: by protocol, the X-Amz-Target
header (JSON), an `Action` form field (query), the path (Smithy RPC v2 CBOR: CloudWatch), or
the method and path matched against botocore's own operation model (REST: S3, Lambda).
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import botocore.session

ENV_REQUEST_LOG = "TRIALBOX_TWIN_REQUEST_LOG"
CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/[^/]+/([^/]+)/([^/]+)/")
FORM = "application/x-www-form-urlencoded"

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# The signing name in a SigV4 credential scope, where it differs from botocore's service name.
SERVICES = {"states": "stepfunctions", "monitoring": "cloudwatch"}
# The Smithy RPC v2 CBOR protocol (CloudWatch's, in botocore) names the operation in the path;
# its body is CBOR, not kept (the calls on it name no resource: GetMetricData).
RPC_V2 = re.compile(r"/service/[^/]+/operation/([^/]+)")


@dataclass(frozen=True)
class Signer:
    """Who signed a request (its SigV4 credential's access key id) and for which region and
    service (the signing name: `states` for Step Functions)."""

    key: str
    region: str
    service: str


def signer(environ: dict[str, Any]) -> Signer | None:
    """The request's signer; None for an unsigned request (moto's own API)."""
    match = CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    return None if match is None else Signer(match.group(1), match.group(2), match.group(3))


class RequestLog:
    """WSGI middleware around moto's server application."""

    def __init__(self, app: App, path: str) -> None:
        self.app = app
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the server
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        entry = self._describe(environ)
        answered: list[int] = []

        def recording(status: str, headers: Any, exc_info: Any = None) -> Any:
            answered.append(int(status.split()[0]))
            return start_response(status, headers, exc_info)

        try:
            return self.app(environ, recording)
        finally:
            if entry is not None:
                entry["status"] = answered[0] if answered else None
                with self._lock:
                    self._file.write(json.dumps(entry) + "\n")

    @staticmethod
    def _describe(environ: dict[str, Any]) -> dict[str, Any] | None:
        signed = signer(environ)
        if signed is None:  # moto's own API (/moto-api/...), unsigned: no principal's call
            return None
        entry: dict[str, Any] = {
            "key": signed.key,
            "region": signed.region,
            "service": signed.service,
            "method": environ.get("REQUEST_METHOD"),
            "path": environ.get("PATH_INFO", ""),
            "query": environ.get("QUERY_STRING", ""),
            "target": environ.get("HTTP_X_AMZ_TARGET"),
            # Which x-amz-* headers came: REST operations that share a route differ by them
            # (PutObject and CopyObject's x-amz-copy-source).
            "headers": sorted(
                k[5:].lower().replace("_", "-") for k in environ if k.startswith("HTTP_X_AMZ_")
            ),
        }
        form = environ.get("CONTENT_TYPE", "").startswith(FORM)
        if entry["target"] or form:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)  # moto reads it again
            text = body.decode(errors="replace")
            if form:
                entry["body"] = {k: v[0] for k, v in parse_qs(text).items()}
            else:
                try:
                    entry["body"] = json.loads(text) if text else {}
                except ValueError:
                    entry["body"] = None
        return entry


def install(server: Any, path: str) -> None:
    """Wrap a started ThreadedMotoServer's application. moto builds the application inside
    its serving thread and offers no hook: its werkzeug server's `app` is replaced before the
    first request (the twin makes none until this returns)."""
    wsgi = getattr(server, "_server", None)
    if wsgi is None or not hasattr(wsgi, "app"):
        raise RuntimeError("moto's ThreadedMotoServer changed: no werkzeug server to log")
    wsgi.app = RequestLog(wsgi.app, path)


class UnmappedOperation(Exception):
    pass


@dataclass(frozen=True)
class Call:
    key: str  # the caller's access key id (trialbox.local.principals)
    service: str  # botocore's name
    operation: str
    params: dict[str, Any] = field(default_factory=dict)
    status: int | None = None

    def __str__(self) -> str:
        shown = {k: v for k, v in self.params.items() if isinstance(v, str) and len(v) < 120}
        return f"{self.service}:{self.operation} {shown}"


@cache
def _model(service: str) -> Any:
    return botocore.session.get_session().get_service_model(service)


Route = tuple[str, re.Pattern[str], frozenset[str], frozenset[str], int, str]


def _required_headers(operation: Any) -> frozenset[str]:
    shape = operation.input_shape
    if shape is None:
        return frozenset()
    return frozenset(
        shape.members[m].serialization.get("name", m).lower()
        for m in shape.required_members
        if shape.members[m].serialization.get("location") == "header"
    )


@cache
def _routes(service: str) -> list[Route]:
    """(method, path regex, query keys required, headers required, literal length, operation)
    for a REST service, most specific first."""
    model = _model(service)
    routes = []
    for name in model.operation_names:
        operation = model.operation_model(name)
        http = operation.http
        path, _, query = http["requestUri"].partition("?")
        regex = re.sub(
            r"\\\{(\w+)(\\\+)?\\\}",
            lambda m: f"(?P<{m.group(1)}>{'.+' if m.group(2) else '[^/]+'})",
            re.escape(path),
        )
        keys = frozenset(part.split("=", 1)[0] for part in query.split("&") if part)
        literal = len(re.sub(r"\{[^}]+\}", "", path))
        headers = _required_headers(operation)
        routes.append((http["method"], re.compile(regex), keys, headers, literal, name))
    routes.sort(key=lambda r: (-len(r[2]), -len(r[3]), -r[4]))
    return routes


def parse(entry: dict[str, Any]) -> Call:
    """One request-log line as a call: its operation and parameters."""
    service = SERVICES.get(entry["service"], entry["service"])
    body = entry.get("body") or {}
    if entry.get("target"):
        operation = entry["target"].rsplit(".", 1)[-1]
        return Call(entry["key"], service, operation, body, entry.get("status"))
    if isinstance(body, dict) and "Action" in body:
        return Call(entry["key"], service, body["Action"], body, entry.get("status"))
    rpc = RPC_V2.fullmatch(entry.get("path") or "")
    if rpc is not None:
        return Call(entry["key"], service, rpc.group(1), {}, entry.get("status"))
    query = parse_qs(entry.get("query", ""), keep_blank_values=True)
    path = entry["path"] or "/"
    if service == "s3" and path.endswith("/") and path.count("/") == 2:
        path = path[:-1]  # "/bucket/" is the bucket
    headers = set(entry.get("headers", []))
    for method, regex, keys, needed, _, operation in _routes(service):
        found = regex.fullmatch(path)
        if method == entry["method"] and found and keys <= set(query) and needed <= headers:
            params = dict(found.groupdict()) | {k: v[0] for k, v in query.items()}
            return Call(entry["key"], service, operation, params, entry.get("status"))
    raise UnmappedOperation(f"{service}: {entry['method']} {entry['path']}?{entry['query']}")


def calls(path: Path) -> list[Call]:
    """Every call a request log recorded, in order."""
    return [parse(json.loads(line)) for line in path.read_text().splitlines() if line]
