"""What a Lambda function URL takes and answers (buffered invoke mode), and the HTTP intake of
the two loopback servers that stand for or in front of one: the twin's function URLs
(trialbox.local.function_urls) and the SandboxFusion proxy (trialbox.integrations.
sandbox_fusion). Both refuse what AWS refuses, with the same caps.

A request is read whole within its limits, or refused with a 4xx JSON body that says why and
its connection closed: a missing, negative, non-numeric or conflicting Content-Length, a
Transfer-Encoding (chunked bodies are not taken), a header line that is not `Name: value`, a
body over the cap (refused before it is read), and a request not received whole within
REQUEST_DEADLINE_S (a slow body or slow headers, or a pipelined request's: the deadline is for
the whole request, not per read). Each server takes at most
`max_connections` at once; the next is answered at once by the server's overload answer."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Lambda's synchronous payload limits, measured on the JSON Lambda passes: the whole event for
# a request (a function URL's body, its headers and requestContext: "Request must be smaller
# than 6291456 bytes for the InvokeFunction operation"), the function's returned JSON for an
# answer ("Response payload size exceeded maximum allowed payload size (6291556 bytes)").
MAX_REQUEST_BYTES = 6 * 2**20
MAX_RESPONSE_BYTES = 6 * 2**20 + 100
REQUEST_TOO_LARGE = (
    f"Request must be smaller than {MAX_REQUEST_BYTES} bytes for the InvokeFunction operation"
)
# Lambda passes a body of these types as text in the event, any other base64 (4/3 its size).
_TEXT_TYPES = re.compile(r"\s*(text/|application/(json|xml|javascript)|[^;]*\+(json|xml))", re.I)
# A request's line, headers and body arrive within this; an idle keep-alive connection closes
# after it too. 6 MB at 200 kB/s: a trainer node on loopback sends it in milliseconds.
REQUEST_DEADLINE_S = 30.0
WRITE_TIMEOUT_S = 60.0  # an answer the client does not read frees its thread after this
LINGER_S = 2.0  # after a refusal, the unread body is drained so that the client reads it
_LENGTH = re.compile(r"[0-9]{1,15}")


def event_body(headers: dict[str, str], body: bytes) -> tuple[str, bool]:
    """The event's `body` and `isBase64Encoded` for a request, as Lambda makes them."""
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if _TEXT_TYPES.match(content_type):
        try:
            return body.decode(), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), True


def payload_bytes(value: Any) -> int:
    """The size of a function's answer `value` as Lambda measures it, at most: ASCII-escaped
    JSON, in which a non-ASCII character costs 6 bytes (12 outside the BMP)."""
    return len(json.dumps(value))


def event_json(event: dict[str, Any]) -> bytes:
    """A request's event as Lambda passes it (and measures it): JSON in UTF-8."""
    return json.dumps(event, ensure_ascii=False).encode()


class Refused(Exception):
    """A request the intake does not take: its status and a reason the caller can act on."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _TooSlow(Exception):
    """The request was not received whole by its deadline."""


class _CountingReader(io.BufferedReader):
    """A buffered reader that counts the bytes handed to the handler (`consumed`): what was
    received beyond them belongs to the next request."""

    consumed = 0

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.consumed += len(line)
        return line

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.consumed += len(data)
        return data


class _DeadlineReader(socket.SocketIO):
    """A connection's reads, each bounded by what is left of its handler's deadline: a client
    that sends one byte a second cannot stretch a request past it."""

    def __init__(self, sock: socket.socket, handler: IntakeHandler) -> None:
        super().__init__(sock, "rb")
        self.sock = sock
        self.handler = handler

    def readinto(self, b: Any) -> int:
        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            raise _TooSlow
        self.sock.settimeout(left)
        try:
            n = super().readinto(b) or 0
        except TimeoutError:
            raise _TooSlow from None
        self.handler.received += n
        return n


class IntakeHandler(BaseHTTPRequestHandler):
    """A handler whose `read_body` gives the body within the caps or raises Refused, and
    whose refusals are JSON (`error_body`) with the connection closed."""

    protocol_version = "HTTP/1.1"
    max_body_bytes = MAX_REQUEST_BYTES
    deadline = 0.0
    received = 0  # bytes read from the connection so far
    started = 0  # bytes of the requests before this one (read and handled)
    rfile: _CountingReader

    def error_body(self, detail: str) -> dict[str, Any]:
        return {"detail": detail}

    def setup(self) -> None:
        super().setup()
        self.rfile = _CountingReader(_DeadlineReader(self.connection, self))
        self._next_request()

    def _next_request(self) -> None:
        """The next request's deadline starts now; its bytes are those past what the handler
        has read (a pipelined request may have arrived with the last one)."""
        self.deadline = time.monotonic() + REQUEST_DEADLINE_S
        self.started = self.rfile.consumed

    def handle(self) -> None:
        try:
            super().handle()
        except _TooSlow:
            if self.received > self.started:  # a request begun; an idle one just closes
                self.refuse(
                    Refused(
                        HTTPStatus.REQUEST_TIMEOUT,
                        f"the request was not received whole within {REQUEST_DEADLINE_S:.0f} s",
                    )
                )

    def parse_request(self) -> bool:
        """The stdlib's parse, refused (400) if a header line did not parse: the stdlib stops
        at it (`Name : value`, a line with no colon) and would not see the headers after it."""
        if not super().parse_request():
            return False
        if self.headers.defects or self.headers.get_payload():
            self.refuse(
                Refused(
                    HTTPStatus.BAD_REQUEST,
                    "a header line is not `Name: value` (a space before the colon, or no "
                    "colon): the headers after it would go unseen, so none are taken",
                )
            )
            return False
        return True

    def declared_length(self) -> int:
        """The body's length from the headers, or Refused."""
        if self.headers.get_all("Transfer-Encoding"):
            raise Refused(
                HTTPStatus.LENGTH_REQUIRED,
                "Transfer-Encoding is not accepted: send the body whole with a Content-Length",
            )
        values = [v.strip() for v in self.headers.get_all("Content-Length") or []]
        if not values:
            if self.command in ("POST", "PUT"):
                raise Refused(HTTPStatus.LENGTH_REQUIRED, "a body needs a Content-Length header")
            return 0
        if len(set(values)) > 1:
            raise Refused(HTTPStatus.BAD_REQUEST, f"conflicting Content-Length headers {values}")
        if not _LENGTH.fullmatch(values[0]):
            raise Refused(
                HTTPStatus.BAD_REQUEST,
                f"Content-Length {values[0][:40]!r} is not a byte count (digits only)",
            )
        length = int(values[0])
        if length > self.max_body_bytes:
            raise Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"a body of {length} bytes is over the {self.max_body_bytes} bytes a Lambda "
                "function URL takes: send less code, stdin or files",
            )
        return length

    def handle_expect_100(self) -> bool:
        try:  # refused before the client sends the body
            self.declared_length()
        except Refused as refused:
            self.refuse(refused)
            return False
        return super().handle_expect_100()

    def read_body(self) -> bytes:
        """The whole body (Refused if the headers do not allow it; _TooSlow past the
        deadline)."""
        length = self.declared_length()
        body = self.rfile.read(length)
        if len(body) < length:  # the client closed early
            raise Refused(HTTPStatus.BAD_REQUEST, f"the body ended after {len(body)} bytes")
        return body

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own refusals (a header line too long, too many headers), as JSON."""
        self.refuse(Refused(code, message or HTTPStatus(code).phrase))

    def refuse(self, refused: Refused) -> None:
        """Answer a refusal, close the connection, and drain what the client still sends
        (briefly) so that it reads the answer rather than a reset."""
        self.close_connection = True
        try:
            self.send_json(refused.status, self.error_body(refused.detail))
            self.connection.shutdown(socket.SHUT_WR)
            end = time.monotonic() + LINGER_S
            while (left := end - time.monotonic()) > 0:
                self.connection.settimeout(left)
                if not self.connection.recv(65536):
                    break
        except OSError:
            pass  # the client went away: nothing left to tell it

    def send_json(
        self, status: int, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.connection.settimeout(WRITE_TIMEOUT_S)
        self.send_response(status)
        sent = {k.lower() for k in headers or {}}
        for name, value in (headers or {}).items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        if "content-type" not in sent:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self._next_request()


class IntakeServer(ThreadingHTTPServer):
    """A threading server of at most `max_connections` connections at once; the next gets
    `overloaded` (status, JSON body) at once, from the accepting thread, and is closed."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: Callable[..., IntakeHandler],
        max_connections: int,
        overloaded: tuple[int, dict[str, Any]],
    ) -> None:
        super().__init__(address, handler)
        self.connections = threading.BoundedSemaphore(max_connections)
        status, body = overloaded
        data = json.dumps(body).encode()
        self.overloaded = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        ).encode() + data

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.acquire(blocking=False):
            try:
                request.settimeout(1)
                request.sendall(self.overloaded)  # small: the socket buffer takes it whole
            except OSError:
                pass  # the client went away
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()
