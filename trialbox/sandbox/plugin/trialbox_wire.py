"""The data-only wire between the grader and the policy's process (standard library only).

A message is a JSON document and the raw bytes it names. Plain values are JSON with a fixed set
of tags for what JSON lacks (tuples, sets, bytes, complex, dicts with any keys, numeric arrays);
a tag can never name a class, so decoding builds exact built-in types and nothing else.
Whatever is not a plain value crosses as a reference (`{"$": "ref", ...}`), which the policy's
side makes for its own objects and the grader's side turns into a remote handle.

Bytes, bytearrays and arrays cross as blobs: each value's bytes sent as they are after the
document, which names it by its place (`{"$": "bytes", "blob": 0}`), and read straight into
the object it becomes. So a value costs its own size on each side, once: encoded in base64
inside a JSON string and framed, a 150 MiB global that `from solution import *` copies took
about 950 MiB at once, and ended an honest solution `oom` at 512 MiB.

The frame: the document's length and the number of blobs (4 bytes each), each blob's length
(8 bytes), the document, the blobs. Read exactly, one message at a time: anything already
waiting after a message is the other side's breach of the protocol.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

MAX_FRAME = 256 * 1024 * 1024  # a message: its document and its blobs
MAX_BLOBS = 1 << 16
CHUNK = 4 << 20  # a bytearray blob grows by reads of at most this
BLOB_TAGS = frozenset({"bytes", "bytearray", "ndarray"})
MAX_DEPTH = 100
BIG_INT_BITS = 10_000  # about 3000 decimal digits: CPython's int/str limit is 4300
SCALARS = (type(None), bool, int, float, str)
ARRAY_KINDS = frozenset("biufcUSmM")  # numpy dtype kinds that are plain data

Ref = Callable[[Any], dict[str, Any]]
Resolve = Callable[[dict[str, Any]], Any]


class WireError(Exception):
    """A value that cannot cross, or a frame that breaks the protocol."""


class Closed(WireError):
    """The other side is gone."""


class Blob:
    """A value's bytes, sent after the document that names it (never JSON itself)."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data  # no buffer export held: `send` takes its own, and releases it


def encode(value: Any, ref: Ref | None, depth: int = 0) -> Any:
    """`ref` turns a non-plain value into a reference; without one it is refused."""
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested deeper than {MAX_DEPTH} levels cannot cross")
    kind = type(value)
    if kind is int and value.bit_length() > BIG_INT_BITS:
        return {"$": "int", "v": hex(value)}  # past JSON's decimal digit limit
    if kind in SCALARS:
        return value
    if kind is list:
        return {"$": "list", "v": [encode(v, ref, depth + 1) for v in value]}
    if kind is tuple:
        return {"$": "tuple", "v": [encode(v, ref, depth + 1) for v in value]}
    if kind is dict:
        return {
            "$": "dict",
            "v": [[encode(k, ref, depth + 1), encode(v, ref, depth + 1)] for k, v in value.items()],
        }
    if kind in (set, frozenset):
        return {"$": kind.__name__, "v": [encode(v, ref, depth + 1) for v in value]}
    if kind in (bytes, bytearray):
        return {"$": kind.__name__, "blob": Blob(value)}
    if kind is complex:
        return {"$": "complex", "v": [value.real, value.imag]}
    if kind is slice:
        parts = (value.start, value.stop, value.step)
        return {"$": "slice", "v": [encode(v, ref, depth + 1) for v in parts]}
    number = _number(value)
    if number is not None:
        return number
    array = _array(value)
    if array is not None:
        return array
    if ref is None:
        raise WireError(
            f"a {kind.__name__!r} object cannot be passed to the solution's code: only plain "
            "values (None, bool, int, float, str, bytes and containers of them) cross the "
            "isolation boundary; a task that needs more sets grading.isolation: in_process"
        )
    return ref(value)


def _number(value: Any) -> dict[str, Any] | None:
    """Fraction and Decimal cross as values: exact, and comparable with the test's numbers."""
    kind = type(value)
    if kind.__module__ == "fractions" and kind.__name__ == "Fraction":
        return {"$": "fraction", "v": [value.numerator, value.denominator]}
    if kind.__module__ in ("decimal", "_decimal", "_pydecimal") and kind.__name__ == "Decimal":
        return {"$": "decimal", "v": str(value)}
    return None


def _array(value: Any) -> dict[str, Any] | None:
    """A numpy array of a plain dtype crosses as its bytes (numpy may not be installed)."""
    module = type(value).__module__
    if module != "numpy" or type(value).__name__ != "ndarray":
        return None
    if value.dtype.kind not in ARRAY_KINDS:
        return None
    return {
        "$": "ndarray",
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "blob": Blob(value),
    }


def decode(doc: Any, resolve: Resolve | None, depth: int = 0) -> Any:
    if depth > MAX_DEPTH + 1:
        raise WireError("a value nested too deep")
    if type(doc) in SCALARS:
        return doc
    if type(doc) is not dict:
        raise WireError(f"a malformed value: {type(doc).__name__}")
    tag, body = doc.get("$"), doc.get("v")
    if tag == "ref":
        if resolve is None:
            raise WireError("a reference where only plain values may come")
        return resolve(doc)
    if tag in ("list", "tuple", "set", "frozenset"):
        items = [decode(v, resolve, depth + 1) for v in _list(body)]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict":
        pairs = _list(body)
        return {
            decode(k, resolve, depth + 1): decode(v, resolve, depth + 1)
            for k, v in (_pair(p) for p in pairs)
        }
    if tag in ("bytes", "bytearray"):
        return _blob(doc, bytes if tag == "bytes" else bytearray)
    if tag == "int":
        return int(str(body), 16)
    if tag == "slice":
        start, stop, step = (decode(v, resolve, depth + 1) for v in _list(body)[:3])
        return slice(start, stop, step)
    if tag == "fraction":
        import fractions

        numerator, denominator = _pair(body)
        return fractions.Fraction(int(numerator), int(denominator))
    if tag == "decimal":
        import decimal

        return decimal.Decimal(str(body))
    if tag == "complex":
        real, imag = _pair(body)
        return complex(float(real), float(imag))
    if tag == "ndarray":
        import numpy

        dtype = numpy.dtype(str(doc["dtype"]))
        if dtype.kind not in ARRAY_KINDS:
            raise WireError(f"an array of dtype {dtype} cannot cross")
        shape = tuple(int(n) for n in _list(doc["shape"]))
        try:  # a bytearray: the array is writable, with no copy
            return numpy.frombuffer(_blob(doc, bytearray), dtype=dtype).reshape(shape)
        except ValueError as exc:
            raise WireError(f"an array whose bytes do not fit its shape: {exc}") from None
    raise WireError(f"an unknown value tag {tag!r}")


def _blob(doc: dict[str, Any], kind: type) -> Any:
    """The blob a value names, as `recv` read it (never a JSON value: those are not bytes)."""
    data = doc.get("blob")
    if type(data) is not kind:
        raise WireError("a malformed blob")
    return data


def _list(body: Any) -> list[Any]:
    if type(body) is not list:
        raise WireError("a malformed container")
    return body


def _pair(body: Any) -> tuple[Any, Any]:
    if type(body) is not list or len(body) != 2:
        raise WireError("a malformed pair")
    return body[0], body[1]


def send(sock: socket.socket, doc: dict[str, Any]) -> None:
    """One message, within the socket's timeout as a whole (never a fresh one per blob)."""
    placed: list[Blob] = []
    views: list[memoryview] = []

    def place(value: Any) -> int:
        if type(value) is not Blob:
            raise TypeError(f"{type(value).__name__} is not JSON serializable")
        placed.append(value)
        views.append(_bytes_of(value.data))
        return len(views) - 1

    try:
        data = json.dumps(doc, separators=(",", ":"), default=place)
        encoded = data.encode("utf-8", "surrogatepass")
        sizes = [view.nbytes for view in views]
        if len(encoded) + sum(sizes) > MAX_FRAME:
            raise WireError(
                f"a message of {len(encoded) + sum(sizes)} bytes is over the wire's {MAX_FRAME}"
            )
        if len(views) > MAX_BLOBS:
            raise WireError(f"a message of {len(views)} blobs is over the wire's {MAX_BLOBS}")
        head = struct.pack(f">II{len(sizes)}Q", len(encoded), len(sizes), *sizes)
        timeout = sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            parts: list[bytes | memoryview] = [head + encoded, *views]
            for part in parts:
                if deadline is not None:
                    sock.settimeout(_left(deadline))
                sock.sendall(part)
        finally:
            sock.settimeout(timeout)
    finally:
        for view in views:
            view.release()
        for holder in placed:  # a document kept after it is sent holds none of its values
            holder.data = None


def _bytes_of(value: Any) -> memoryview:
    """A value's bytes, as they are: an array's in C order (copied only when it is not
    contiguous), viewed as uint8, since the buffer protocol refuses some plain dtypes."""
    if type(value) not in (bytes, bytearray):
        import numpy

        value = numpy.ascontiguousarray(value).reshape(-1).view(numpy.uint8)
    return memoryview(value).cast("B")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def recv(sock: socket.socket) -> dict[str, Any]:
    """One message, within the socket's timeout as a whole: each read waits for all it asks
    (MSG_WAITALL) up to the time left (SO_RCVTIMEO). A socket with a timeout is non-blocking
    underneath, where a read returns what has come so far, and a bytes value would arrive in
    pieces to be copied together."""
    timeout = sock.gettimeout()
    if timeout is None:
        return _recv(_Reader(sock, None))
    sock.settimeout(None)
    try:
        return _recv(_Reader(sock, time.monotonic() + timeout))
    except BlockingIOError:  # SO_RCVTIMEO ran out
        raise TimeoutError("timed out") from None
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
        sock.settimeout(timeout)


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))


class _Reader:
    """Exact reads from the socket, before its deadline."""

    def __init__(self, sock: socket.socket, deadline: float | None) -> None:
        self.sock = sock
        self.deadline = deadline

    def _recv(self, size: int) -> bytes:
        if self.deadline is not None:
            wait = max(_left(self.deadline), 0.001)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(wait))
        data = self.sock.recv(size, socket.MSG_WAITALL)
        if not data:
            raise Closed("the other side closed the wire")
        return data

    def exactly(self, size: int) -> bytes:
        """`size` bytes, in one object (no copy when one read brings them all)."""
        if not size:
            return b""
        data = self._recv(size)
        if len(data) == size:
            return data
        return data + bytes(self.into(size - len(data)))

    def into(self, size: int) -> bytearray:
        """`size` bytes in a bytearray that grows as they come (never zero-filled ahead: a
        length alone takes no memory)."""
        data = bytearray()
        while len(data) < size:
            data += self._recv(min(size - len(data), CHUNK))
        return data


def _recv(reader: _Reader) -> dict[str, Any]:
    size, count = struct.unpack(">II", reader.exactly(8))
    if count > MAX_BLOBS:
        raise WireError(f"a message of {count} blobs is over the wire's {MAX_BLOBS}")
    sizes = struct.unpack(f">{count}Q", reader.exactly(8 * count)) if count else ()
    if size + sum(sizes) > MAX_FRAME:
        raise WireError(f"a message of {size + sum(sizes)} bytes is over the wire's {MAX_FRAME}")
    named: dict[int, dict[str, Any]] = {}

    def blob_of(obj: dict[str, Any]) -> dict[str, Any]:
        if "blob" in obj:
            index, tag = obj["blob"], obj.get("$")
            if type(tag) is not str or tag not in BLOB_TAGS or type(index) is not int:
                raise WireError("a malformed blob")
            if index in named:
                raise WireError("a malformed blob: named twice")
            if not 0 <= index < count:
                raise WireError("a blob the message does not carry")
            named[index] = obj
        return obj

    text = reader.exactly(size).decode("utf-8", "surrogatepass")
    doc = json.loads(text, object_hook=blob_of)
    if type(doc) is not dict:
        raise WireError("a message that is not an object")
    if len(named) != count:
        raise WireError("a blob no value names")
    for index, blob_size in enumerate(sizes):
        obj = named[index]
        obj["blob"] = reader.exactly(blob_size) if obj["$"] == "bytes" else reader.into(blob_size)
    with contextlib.suppress(BlockingIOError, InterruptedError):
        if reader.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
            raise WireError("a message longer than its length: one request at a time")
    return doc
