"""The boundary's wire (trialbox/sandbox/plugin/trialbox_wire.py) over a real socket pair:
bytes-like values cross as blobs of their own size and exact type; a message that names a blob
it does not carry, names one twice, or arrives behind another is refused; a message is sent
and read within the socket's timeout as a whole; and the grader's client ends a policy whose
reply broke the wire, so nothing it left unread is taken for a later reply."""

from __future__ import annotations

import contextlib
import importlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy
import pytest

import trialbox.sandbox
from tests.support.modules import from_file

PLUGIN = Path(trialbox.sandbox.__file__).with_name("plugin") / "trialbox_wire.py"


@pytest.fixture(scope="module")
def wire() -> ModuleType:
    return from_file("trialbox_wire", PLUGIN)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    right.settimeout(5)  # as the grader's side reads: a socket with a timeout
    yield left, right
    left.close()
    right.close()


def _cross(wire: ModuleType, pair: tuple[socket.socket, socket.socket], value: Any) -> Any:
    left, right = pair
    sender = threading.Thread(target=wire.send, args=(left, {"ok": wire.encode(value, None)}))
    sender.start()  # a large message fills the socket's buffer before it is read
    doc = wire.recv(right)
    sender.join()
    return wire.decode(doc["ok"], None)


def test_bytes_like_values_cross_with_their_type_and_bytes(wire: ModuleType, pair: Any) -> None:
    big = bytes(range(256)) * (1 << 14)  # 4 MiB: more than a socket buffer holds
    value = [big, bytearray(b"ab"), b"", numpy.arange(6, dtype="<i4").reshape(2, 3)]
    got = _cross(wire, pair, value)
    assert type(got[0]) is bytes and got[0] == big
    assert type(got[1]) is bytearray and got[1] == bytearray(b"ab")
    assert got[2] == b""
    assert got[3].dtype == numpy.dtype("<i4") and got[3].tolist() == [[0, 1, 2], [3, 4, 5]]
    got[3][0, 0] = 7  # the array is the receiver's own, writable
    dates = numpy.array(["2026-12-07"], dtype="datetime64[D]")  # no buffer protocol of its own
    assert _cross(wire, pair, dates).tolist() == dates.tolist()


def _raw(sock: socket.socket, doc: dict[str, Any], blobs: list[bytes]) -> None:
    data = json.dumps(doc).encode()
    sizes = [len(b) for b in blobs]
    sock.sendall(struct.pack(f">II{len(sizes)}Q", len(data), len(sizes), *sizes) + data)
    for blob in blobs:
        sock.sendall(blob)


@pytest.mark.parametrize(
    ("doc", "blobs", "refused"),
    [
        ({"ok": {"$": "bytes", "blob": 1}}, [b"x"], "a blob the message does not carry"),
        ({"ok": [{"$": "bytes", "blob": 0}, {"$": "bytes", "blob": 0}]}, [b"x"], "malformed"),
        ({"ok": {"$": "list", "blob": 0}}, [b"x"], "malformed"),
        ({"ok": {"$": "bytes", "blob": "0"}}, [b"x"], "malformed"),
        ({"ok": 1}, [b"x"], "a blob no value names"),
    ],
)
def test_a_message_that_misnames_its_blobs_is_refused(
    wire: ModuleType, pair: Any, doc: dict[str, Any], blobs: list[bytes], refused: str
) -> None:
    left, right = pair
    _raw(left, doc, blobs)
    with pytest.raises(wire.WireError, match=refused):
        wire.recv(right)


def test_a_value_in_json_is_never_taken_for_a_blob(wire: ModuleType, pair: Any) -> None:
    left, right = pair
    _raw(left, {"ok": {"$": "bytes", "v": "eA=="}}, [])  # the old base64 form: no bytes
    with pytest.raises(wire.WireError, match="malformed blob"):
        wire.decode(wire.recv(right)["ok"], None)


def test_a_reply_sent_ahead_of_its_request_is_refused(wire: ModuleType, pair: Any) -> None:
    left, right = pair
    wire.send(left, {"ok": 1})
    wire.send(left, {"ok": 2})  # queued for the next request: a forged answer
    with pytest.raises(wire.WireError, match="one request at a time"):
        wire.recv(right)


def test_a_message_over_the_frame_is_refused_before_it_is_read(wire: ModuleType, pair: Any) -> None:
    left, right = pair
    left.sendall(struct.pack(">IIQ", 10, 1, wire.MAX_FRAME))
    with pytest.raises(wire.WireError, match="over the wire's"):
        wire.recv(right)


def test_a_silent_sender_times_out(wire: ModuleType, pair: Any) -> None:
    left, right = pair
    right.settimeout(0.2)
    left.sendall(struct.pack(">II", 100, 0))  # a length, then nothing
    with pytest.raises(TimeoutError):
        wire.recv(right)
    assert right.gettimeout() == 0.2


def test_a_sent_bytearray_stays_the_senders_to_resize(wire: ModuleType, pair: Any) -> None:
    """Was a break: the sent document held a buffer export of the value, so a solution's
    module-level bytearray could not grow after its module was described (BufferError)."""
    left, right = pair
    held, array = bytearray(b"ab"), numpy.zeros(3)
    doc = {"ok": wire.encode([held, array], None)}  # kept after it is sent, as a reply is
    wire.send(left, doc)
    held.extend(b"cd")
    array.resize(6, refcheck=False)
    got = wire.decode(wire.recv(right)["ok"], None)
    assert got[0] == bytearray(b"ab") and got[1].tolist() == [0.0] * 3


def test_a_trickled_reply_times_out_at_the_sockets_timeout(wire: ModuleType, pair: Any) -> None:
    """Was a break: each read had a timeout of its own, so a byte every 0.35 s kept a 0.5 s
    reply going for seconds."""
    left, right = pair
    right.settimeout(0.5)
    body = b'{"ok":"late"}'
    message = struct.pack(">II", len(body), 0) + body

    def trickle() -> None:
        for byte in message:
            time.sleep(0.2)
            try:
                left.send(bytes([byte]))
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wire.recv(right)
    assert time.monotonic() - started < 2.0  # the whole message would take 3.4 s


def test_a_message_is_sent_within_the_sockets_timeout(wire: ModuleType, pair: Any) -> None:
    """Was a break: each blob's sendall had the whole timeout again, so a reader that takes
    each blob just before it runs out held the sender past its deadline."""
    left, right = pair
    left.settimeout(0.6)
    blobs = [bytes(4 << 20) for _ in range(4)]

    def slow_reader() -> None:  # a pause of 0.35 s after each 4 MiB: each blob within 0.6 s
        read = 0
        with contextlib.suppress(OSError):
            while chunk := right.recv(1 << 20):
                read += len(chunk)
                if read >= 4 << 20:
                    read -= 4 << 20
                    time.sleep(0.35)

    threading.Thread(target=slow_reader, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wire.send(left, {"ok": [wire.encode(blob, None) for blob in blobs]})
    assert time.monotonic() - started < 1.2  # the whole message would take 1.4 s
    assert left.gettimeout() == 0.6


def test_a_reply_that_breaks_the_wire_ends_the_policy(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: a malformed frame raised past the client's handlers with the socket still
    open, and what the policy had queued behind it was read as the next call's reply."""
    monkeypatch.syspath_prepend(str(PLUGIN.parent))
    client = importlib.import_module("trialbox_boundary_client")
    grader, policy = pair
    control, _control_peer = socket.socketpair()

    class Policy(client.Policy):  # type: ignore[misc,name-defined]
        def ref_doc(self, value: Any) -> Any:
            raise TypeError(value)

        def proxy(self, doc: Any) -> Any:
            return doc

    p = Policy(control.detach(), 5.0)
    p.sock = grader
    forged = json.dumps({"ok": "forged"}).encode()
    _raw(policy, {"ok": {"$": ["bytes"], "blob": 0}}, [struct.pack(">II", len(forged), 0) + forged])
    with pytest.raises(client.PolicyDied, match="broke the wire"):
        p.ask({"op": "call"})
    assert p.sock is None  # ended: never read again
