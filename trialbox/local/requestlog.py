"""An opt-in log of the requests the twin's AWS side serves, one JSON line each: who called
(the access key id of its SigV4 credential, trialbox.local.principals), the service, and the
raw request facts that name the operation and its resource. Bodies are kept only for the JSON
protocol (an X-Amz-Target header) and the query protocol (a form), whose parameters live
there; the REST protocols (S3, Lambda) name theirs in the path, and their bodies are data.

Set TRIALBOX_TWIN_REQUEST_LOG=<path> in the environment of the process that starts the twin.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

ENV_REQUEST_LOG = "TRIALBOX_TWIN_REQUEST_LOG"
CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/[^/]+/([^/]+)/([^/]+)/")
FORM = "application/x-www-form-urlencoded"

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


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
