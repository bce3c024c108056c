"""The twin's Lambda function URLs: an HTTP server per URL on loopback, each request made a
function URL event (payload format 2.0: a repeated header's values joined by commas) for the
function's real handler, and its answer the HTTP response, as Lambda does. Signatures are
not checked (tests/iam checks the policies). It takes what a function URL takes
(trialbox.function_url: the 6 MB event, a Content-Length, a request received whole in time)
and refuses the rest as AWS does, and answers 502 for a function answer over Lambda's 6 MB,
as Lambda does."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from threading import Thread
from typing import Any
from urllib.parse import urlsplit

from trialbox.function_url import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    REQUEST_TOO_LARGE,
    IntakeHandler,
    IntakeServer,
    Refused,
    event_body,
    event_json,
)
from trialbox.local.functions import Throttled
from trialbox.local.resources import ACCOUNT

Invoke = Callable[[str, bytes], tuple[bool, bytes]]
JSON = {"Content-Type": "application/json"}
THROTTLED = {"Message": "Rate Exceeded."}
MAX_CONNECTIONS = 64


class FunctionUrl:
    """A function's URL, bound at once (its address goes into the stack's outputs) and
    answering once `start` names how to invoke the function."""

    def __init__(self, function: str, max_connections: int = MAX_CONNECTIONS) -> None:
        self.function = function
        self.server = IntakeServer(
            ("127.0.0.1", 0),
            _handler(self),
            max_connections,
            (HTTPStatus.TOO_MANY_REQUESTS, THROTTLED),
        )
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
        """The function's answer to a request (`headers` as the event carries them: names in
        lower case, repeated values joined)."""
        assert self.invoke is not None
        path = urlsplit(target)
        text, encoded = event_body(headers, body)
        event = {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path.path,
            "rawQueryString": path.query,
            "headers": headers,
            "requestContext": {  # as Lambda fills it for a URL with AWS_IAM auth
                "accountId": ACCOUNT,
                "apiId": self.function.lower(),
                "authorizer": {"iam": {"accessKey": _access_key(headers), "accountId": ACCOUNT}},
                "domainName": urlsplit(self.url).netloc,
                "domainPrefix": self.function.lower(),
                "http": {"method": method, "path": path.path, "protocol": "HTTP/1.1",
                         "sourceIp": "127.0.0.1", "userAgent": headers.get("user-agent", "")},
                "requestId": f"local-{time.monotonic_ns()}",
                "routeKey": "$default",
                "stage": "$default",
                "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime()),
                "timeEpoch": int(time.time() * 1000),
            },
            "body": text,
            "isBase64Encoded": encoded,
        }  # fmt: skip
        request = event_json(event)
        if len(request) > MAX_REQUEST_BYTES:
            return 413, JSON, json.dumps({"Message": REQUEST_TOO_LARGE}).encode()
        try:
            ok, payload = self.invoke(self.function, request)
        except Throttled:  # at its reserved concurrency, as Lambda answers
            return 429, JSON, json.dumps(THROTTLED).encode()
        if ok and len(payload) > MAX_RESPONSE_BYTES:
            ok, payload = False, b"Function.ResponseSizeTooLarge: %d bytes" % len(payload)
        if not ok:  # Lambda's answer to a function error or timeout; the error in the log
            print(f"function URL of {self.function}: {payload.decode()[:2000]}", file=sys.stderr)
            return 502, JSON, b'{"Message":"Internal Server Error"}'
        out: Any = json.loads(payload)
        data = out.get("body") or ""
        raw = base64.b64decode(data) if out.get("isBase64Encoded") else str(data).encode()
        return int(out.get("statusCode", 200)), dict(out.get("headers") or {}), raw


def _access_key(headers: dict[str, str]) -> str:
    """The access key id a SigV4 Authorization header names ("" if unsigned)."""
    auth = headers.get("authorization", "")
    return auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else ""


def _joined(handler: IntakeHandler) -> dict[str, str]:
    """A request's headers as Lambda's payload 2.0 passes them: names in lower case, a
    repeated header's values joined by commas (so the event's size counts them all)."""
    headers: dict[str, str] = {}
    for name, value in handler.headers.items():
        key = name.lower()
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    return headers


def _handler(url: FunctionUrl) -> type[IntakeHandler]:
    class Handler(IntakeHandler):
        def error_body(self, detail: str) -> dict[str, Any]:
            return {"Message": detail}

        def _serve(self) -> None:
            try:
                body = self.read_body()
            except Refused as refused:
                self.refuse(refused)
                return
            status, headers, raw = url.answer(self.command, self.path, _joined(self), body)
            self.send_json(status, raw, headers)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
