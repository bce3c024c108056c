"""The twin's Lambda function URLs: an HTTP server per URL on loopback, each request made a
function URL event (payload format 2.0) for the function's real handler, and its answer the
HTTP response, as Lambda does. Signatures are not checked (tests/iam checks the policies)."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any
from urllib.parse import urlsplit

from trialbox.local.functions import Throttled
from trialbox.local.resources import ACCOUNT

Invoke = Callable[[str, bytes], tuple[bool, bytes]]


class FunctionUrl:
    """A function's URL, bound at once (its address goes into the stack's outputs) and
    answering once `start` names how to invoke the function."""

    def __init__(self, function: str) -> None:
        self.function = function
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.invoke: Invoke | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def start(self, invoke: Invoke) -> None:
        self.invoke = invoke
        Thread(target=self.server.serve_forever, daemon=True, name=f"url-{self.function}").start()

    def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        assert self.invoke is not None
        path = urlsplit(target)
        event = {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path.path,
            "rawQueryString": path.query,
            "headers": {k.lower(): v for k, v in headers.items()},
            "requestContext": {  # as Lambda fills it for a URL with AWS_IAM auth
                "accountId": ACCOUNT,
                "apiId": self.function.lower(),
                "authorizer": {"iam": {"accessKey": _access_key(headers), "accountId": ACCOUNT}},
                "domainName": urlsplit(self.url).netloc,
                "domainPrefix": self.function.lower(),
                "http": {"method": method, "path": path.path, "protocol": "HTTP/1.1",
                         "sourceIp": "127.0.0.1", "userAgent": headers.get("User-Agent", "")},
                "requestId": f"local-{time.monotonic_ns()}",
                "routeKey": "$default",
                "stage": "$default",
                "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime()),
                "timeEpoch": int(time.time() * 1000),
            },
            "body": base64.b64encode(body).decode(),
            "isBase64Encoded": True,
        }  # fmt: skip
        try:
            ok, payload = self.invoke(self.function, json.dumps(event).encode())
        except Throttled:  # at its reserved concurrency, as Lambda answers
            return 429, {"Content-Type": "application/json"}, b'{"Message":"Rate Exceeded."}'
        if not ok:  # Lambda's answer to a function error or timeout; the error in the log
            print(f"function URL of {self.function}: {payload.decode()[:2000]}", file=sys.stderr)
            return 502, {"Content-Type": "application/json"}, b'{"Message":"Internal Server Error"}'
        out: Any = json.loads(payload)
        data = out.get("body") or ""
        raw = base64.b64decode(data) if out.get("isBase64Encoded") else str(data).encode()
        return int(out.get("statusCode", 200)), dict(out.get("headers") or {}), raw


def _access_key(headers: dict[str, str]) -> str:
    """The access key id a SigV4 Authorization header names ("" if unsigned)."""
    auth = headers.get("Authorization", "")
    return auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else ""


def _handler(url: FunctionUrl) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            status, headers, raw = url.answer(self.command, self.path, dict(self.headers), body)
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
