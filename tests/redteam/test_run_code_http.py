"""Red team on /run_code's HTTP layer, over real sockets: the SandboxFusion proxy
(`sandbox_fusion.serve`) and the twin's function URL server (`FunctionUrl`) refuse, with a 4xx
JSON body saying why and the connection closed, every request AWS's function URL would not
take or that would hold the server: a negative, non-numeric, conflicting or missing
Content-Length, a chunked body, a body over the function URL's 6 MB, a body or headers sent
slowly, and more connections than the server serves. Nothing refused reaches the endpoint or
the function. Was a break: `int(Content-Length)` of -1 read the socket to its end, whatever
its size, and the 64 MiB cap was larger than what AWS takes."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from trialbox import function_url as fu
from trialbox.integrations import sandbox_fusion as sf
from trialbox.local.function_urls import FunctionUrl
from trialbox.sdk.core import local_session

CALL = json.dumps({"code": "print(1)", "language": "python"}).encode()


@dataclass
class Recorder:
    """Stands for what is behind a server: the endpoint (proxy) or the function (twin)."""

    bodies: list[bytes] = field(default_factory=list)
    answer: bytes = b'{"status": "Success"}'

    def __call__(self, function: str, event: bytes) -> tuple[bool, bytes]:  # the twin's invoke
        self.bodies.append(event)
        body = self.answer.decode()
        return True, json.dumps({"statusCode": 200, "body": body}).encode()

    def answer_call(self, body: bytes, time_left_s: float | None = None) -> tuple[int, str]:
        self.bodies.append(body)
        return 200, self.answer.decode()


@dataclass
class Served:
    url: str  # the base URL, with no trailing slash
    behind: Recorder
    error_key: str  # where a refusal's reason is: SandboxFusion's "detail", AWS's "Message"


class _Endpoint:
    def __init__(self, recorder: Recorder) -> None:
        self.answer = recorder.answer_call


@pytest.fixture(params=["proxy", "function-url"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    recorder = Recorder()
    if request.param == "proxy":
        server = sf.serve(_Endpoint(recorder), max_connections=4)
        try:
            yield Served(sf.url(server), recorder, "detail")
        finally:
            server.shutdown()
            server.server_close()
    else:
        url = FunctionUrl("RunCode", max_connections=4)
        url.start(recorder)
        try:
            yield Served(url.url.rstrip("/"), recorder, "Message")
        finally:
            url.server.shutdown()
            url.server.server_close()


def _connect(url: str) -> socket.socket:
    host, port = url.split("//")[1].split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    return conn


def _head(headers: dict[str, str]) -> bytes:
    lines = [
        "POST /run_code HTTP/1.1",
        "Host: localhost",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    closed: bool  # the server closed the connection after it


def _read_answer(conn: socket.socket) -> Answer:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed with no answer: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = conn.recv(65536)
        assert chunk
        rest += chunk
    conn.settimeout(LINGER_WAIT_S)
    try:
        closed = conn.recv(1) == b""
    except TimeoutError:
        closed = False
    except ConnectionResetError:
        closed = True
    return Answer(status, json.loads(rest[:length]), closed)


LINGER_WAIT_S = fu.LINGER_S + 3


def _send(url: str, raw: bytes, *, then_close_write: bool = False) -> Answer:
    with _connect(url) as conn:
        conn.sendall(raw)
        if then_close_write:
            conn.shutdown(socket.SHUT_WR)
        return _read_answer(conn)


# --- Content-Length ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "reason"),
    [
        ("-1", "is not a byte count"),
        ("-200000000", "is not a byte count"),
        ("abc", "is not a byte count"),
        ("+12", "is not a byte count"),
        ("1e6", "is not a byte count"),
        ("12, 12", "is not a byte count"),
        ("\u0661\u0662", "is not a byte count"),  # Arabic-Indic digits: int() takes them
    ],
)
def test_a_content_length_that_is_not_a_byte_count_is_400(
    served: Served, length: str, reason: str
) -> None:
    body = b"x" * 200_000  # read to the end of the socket by `int(-1)`, and then run
    answer = _send(served.url, _head({"Content-Length": length}) + body, then_close_write=True)
    assert (answer.status, answer.closed) == (400, True)
    assert reason in answer.body[served.error_key]
    assert served.behind.bodies == []


def test_conflicting_content_lengths_are_400(served: Served) -> None:
    raw = _head({"Content-Length": str(len(CALL))}) + CALL
    raw = raw.replace(b"Host:", b"Content-Length: 3\r\nHost:", 1)
    answer = _send(served.url, raw)
    assert (answer.status, answer.closed) == (400, True)
    assert "conflicting Content-Length" in answer.body[served.error_key]
    assert served.behind.bodies == []


def test_a_post_with_no_content_length_is_411(served: Served) -> None:
    answer = _send(served.url, _head({}) + CALL, then_close_write=True)
    assert (answer.status, answer.closed) == (411, True)
    assert "Content-Length" in answer.body[served.error_key]
    assert served.behind.bodies == []


def test_a_chunked_body_is_411_and_never_desynchronises_the_connection(served: Served) -> None:
    chunked = f"{len(CALL):x}\r\n".encode() + CALL + b"\r\n0\r\n\r\n"
    # A second request pipelined after it: read as a request, it would run.
    raw = _head({"Transfer-Encoding": "chunked"}) + chunked
    raw += _head({"Content-Length": str(len(CALL))}) + CALL
    with _connect(served.url) as conn:
        conn.sendall(raw)
        answer = _read_answer(conn)
    assert (answer.status, answer.closed) == (411, True)
    assert "Transfer-Encoding is not accepted" in answer.body[served.error_key]
    assert served.behind.bodies == []


# --- size ----------------------------------------------------------------------------------------


def test_a_body_over_the_function_urls_limit_is_413_before_it_is_read(served: Served) -> None:
    too_big = fu.MAX_REQUEST_BYTES + 1
    with _connect(served.url) as conn:  # the headers only: the answer must not wait for a body
        conn.sendall(_head({"Content-Length": str(too_big)}))
        answer = _read_answer(conn)
    assert (answer.status, answer.closed) == (413, True)
    assert f"over the {fu.MAX_REQUEST_BYTES} bytes" in answer.body[served.error_key]
    assert served.behind.bodies == []


def test_an_expect_100_continue_over_the_limit_is_413_not_100(served: Served) -> None:
    head = _head({"Content-Length": str(64 * 2**20), "Expect": "100-continue"})
    answer = _send(served.url, head)
    assert (answer.status, answer.closed) == (413, True)


def test_a_client_sending_an_oversized_body_whole_reads_the_413(served: Served) -> None:
    body = b'{"code": "' + b"#" * (fu.MAX_REQUEST_BYTES + 1000) + b'"}'
    answered = requests.post(f"{served.url}/run_code", data=body, timeout=30)
    assert answered.status_code == 413
    assert served.behind.bodies == []


def test_a_body_within_the_limit_is_answered(served: Served) -> None:
    answered = requests.post(f"{served.url}/run_code", data=CALL, timeout=30)
    assert (answered.status_code, answered.json()) == (200, {"status": "Success"})
    assert len(served.behind.bodies) == 1


# --- time and connections ------------------------------------------------------------------------


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(fu, "REQUEST_DEADLINE_S", 1.5)
    return 1.5


def _trickle(conn: socket.socket, data: bytes, started: float, deadline_s: float) -> bool:
    """Send `data`, then wait 0.2 s: False once the server has answered (or closed), or well
    past its deadline."""
    try:
        conn.sendall(data)
    except OSError:
        return False
    answered, _, _ = select.select([conn], [], [], 0.2)
    return not answered and time.monotonic() - started < deadline_s + 2


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "one-byte-at-a-time"])
def test_a_body_sent_slowly_is_408_at_the_deadline(
    served: Served, short_deadline: float, trickle: bool
) -> None:
    started = time.monotonic()
    with _connect(served.url) as conn:
        conn.sendall(_head({"Content-Length": str(len(CALL))}) + CALL[:5])
        if trickle:  # each byte well within any per-read timeout
            for byte in CALL[5:-1]:
                if not _trickle(conn, bytes([byte]), started, short_deadline):
                    break
        answer = _read_answer(conn)
    assert (answer.status, answer.closed) == (408, True)
    assert "not received whole" in answer.body[served.error_key]
    assert time.monotonic() - started < short_deadline + 4
    assert served.behind.bodies == []


def test_headers_sent_slowly_are_408_at_the_deadline(served: Served, short_deadline: float) -> None:
    started = time.monotonic()
    with _connect(served.url) as conn:
        conn.sendall(b"POST /run_code HTTP/1.1\r\n")
        for _ in range(40):  # a header byte every 0.2 s, never the end of the headers
            if not _trickle(conn, b"X", started, short_deadline):
                break
        answer = _read_answer(conn)
    assert (answer.status, answer.closed) == (408, True)
    assert time.monotonic() - started < short_deadline + 4


def test_connections_over_the_limit_are_refused_at_once_and_slots_come_back(
    served: Served, short_deadline: float
) -> None:
    idle = [_connect(served.url) for _ in range(4)]  # the limit: each sends half a request
    try:
        for conn in idle:
            conn.sendall(b"POST /run_code HTTP/1.1\r\n")
        time.sleep(0.3)  # the server has accepted them (nothing to wait on from outside)
        started = time.monotonic()
        with _connect(served.url) as conn:
            conn.sendall(_head({"Content-Length": str(len(CALL))}) + CALL)
            answer = _read_answer(conn)
        assert time.monotonic() - started < 3  # at once: not after a deadline
        assert answer.status in (429, 504) and answer.closed
        assert served.behind.bodies == []
    finally:
        for conn in idle:
            conn.close()
    deadline = time.monotonic() + short_deadline + 5
    while True:  # the slots are free once the server has seen the closes
        answered = requests.post(f"{served.url}/run_code", data=CALL, timeout=30)
        if answered.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert answered.status_code == 200


def test_many_keep_alive_requests_on_one_connection_are_each_answered(served: Served) -> None:
    with requests.Session() as session:
        for _ in range(3):
            answered = session.post(f"{served.url}/run_code", data=CALL, timeout=30)
            assert answered.status_code == 200
    assert len(served.behind.bodies) == 3


# --- what the function URL itself takes and answers -----------------------------------------------


def test_the_twins_url_refuses_an_event_over_lambdas_limit_as_lambda_does() -> None:
    """The limit is on the event: a binary body goes base64 (4/3 larger); a JSON body goes as
    text, so a JSON body just under the cap is taken."""
    recorder = Recorder()
    url = FunctionUrl("RunCode")
    url.start(recorder)
    try:
        base = url.url.rstrip("/")
        binary = requests.post(
            f"{base}/run_code", data=b"\0" * (5 * 2**20),
            headers={"Content-Type": "application/octet-stream"}, timeout=30,
        )  # fmt: skip
        assert binary.status_code == 413
        assert binary.json() == {"Message": fu.REQUEST_TOO_LARGE}
        assert recorder.bodies == []
        text = b'{"code": "' + b"#" * (fu.MAX_REQUEST_BYTES - 4096) + b'"}'
        taken = requests.post(
            f"{base}/run_code", data=text, headers={"Content-Type": "application/json"},
            timeout=30,
        )  # fmt: skip
        assert taken.status_code == 200
        [event] = recorder.bodies
        assert len(event) <= fu.MAX_REQUEST_BYTES
        assert json.loads(event)["isBase64Encoded"] is False
    finally:
        url.server.shutdown()
        url.server.server_close()


def test_the_twins_url_answers_502_for_a_function_answer_over_lambdas_limit() -> None:
    recorder = Recorder(answer=b"x" * fu.MAX_RESPONSE_BYTES)
    url = FunctionUrl("RunCode")
    url.start(recorder)
    try:
        answered = requests.post(f"{url.url.rstrip('/')}/run_code", data=CALL, timeout=30)
        assert answered.status_code == 502
    finally:
        url.server.shutdown()
        url.server.server_close()


def test_the_proxy_refuses_what_the_function_url_would_and_passes_its_413_on() -> None:
    """A body under the cap whose event is over it (JSON escapes a backslash in 2 bytes) is
    refused by the proxy itself, as AWS would; a 413 from the URL stays a 413 (a
    504 would make verl send it again, three times)."""
    recorder = Recorder()
    url = FunctionUrl("RunCode")
    url.start(recorder)
    server = sf.serve(sf.Proxy(url.url, local_session(), timeout_s=30))
    try:
        escaped = json.dumps({"code": "\\" * (2 * 2**20)}).encode()  # 8 MiB as an event
        assert len(escaped) < fu.MAX_REQUEST_BYTES
        answered = requests.post(f"{sf.url(server)}/run_code", data=escaped, timeout=30)
        assert answered.status_code == 413
        assert "function URL takes" in answered.json()["detail"]
        assert recorder.bodies == []
    finally:
        server.shutdown()
        server.server_close()
        url.server.shutdown()
        url.server.server_close()
    status, body = sf.proxied(413, json.dumps({"Message": fu.REQUEST_TOO_LARGE}))
    assert status == 413 and fu.REQUEST_TOO_LARGE in json.loads(body)["detail"]


# --- header parsing ------------------------------------------------------------------------------


def test_the_twins_url_joins_repeated_headers_and_measures_them_all() -> None:
    """Lambda's payload 2.0 joins a repeated header's values with commas: the event, and its
    size, carry every value, so 90 copies of a 64 KB header
    and a 1 MiB body are over the limit."""
    recorder = Recorder()
    url = FunctionUrl("RunCode")
    url.start(recorder)
    try:
        pad = "v" * 64_000
        head = _head({"Content-Length": str(len(CALL)), "Content-Type": "application/json"})
        small = head.replace(b"Host:", b"X-Pad: a\r\nX-Pad: b\r\nHost:", 1)
        answer = _send(url.url.rstrip("/"), small + CALL)
        assert answer.status == 200
        [event] = recorder.bodies
        assert json.loads(event)["headers"]["x-pad"] == "a,b"
        body = json.dumps({"code": "#" * 2**20}).encode()  # taken alone
        head = _head({"Content-Length": str(len(body)), "Content-Type": "application/json"})
        big = head.replace(b"Host:", f"X-Pad: {pad}\r\n".encode() * 90 + b"Host:", 1)
        answer = _send(url.url.rstrip("/"), big + body)
        assert (answer.status, answer.body) == (413, {"Message": fu.REQUEST_TOO_LARGE})
        assert len(recorder.bodies) == 1
    finally:
        url.server.shutdown()
        url.server.server_close()


def test_a_header_line_that_does_not_parse_is_400_and_hides_nothing(served: Served) -> None:
    """`Name : value` (a space before the colon) ends Python's header parse there: the headers
    after it would go unseen (here a Transfer-Encoding). AWS's front refuses it: so do we."""
    raw = _head({"Content-Length": str(len(CALL)), "Transfer-Encoding ": "chunked"}) + CALL
    answer = _send(served.url, raw)
    assert (answer.status, answer.closed) == (400, True)
    assert "header" in answer.body[served.error_key]
    assert served.behind.bodies == []


def test_a_pipelined_request_that_stalls_is_408(served: Served, short_deadline: float) -> None:
    """The second request's bytes arrived with the first's: it has begun, so its stall is a
    408, not a silent close."""
    first = _head({"Content-Length": str(len(CALL))}) + CALL
    with _connect(served.url) as conn:
        conn.sendall(first + _head({"Content-Length": str(len(CALL))}) + CALL[:3])
        assert _read_answer_open(conn) == 200
        answer = _read_answer(conn)
    assert (answer.status, answer.closed) == (408, True)
    assert "not received whole" in answer.body[served.error_key]
    assert len(served.behind.bodies) == 1


def _read_answer_open(conn: socket.socket) -> int:
    """The status of an answer on a connection that stays open (its body read, not parsed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(1)
        assert chunk
        data += chunk
    head = data.decode().split("\r\n")
    length = next(int(h.split(":")[1]) for h in head if h.lower().startswith("content-length"))
    body = b""
    while len(body) < length:
        body += conn.recv(length - len(body))
    return int(head[0].split()[1])
