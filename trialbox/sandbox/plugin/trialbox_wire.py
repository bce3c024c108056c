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
from collections.abc import Callable, Iterator
from typing import Any

MAX_FRAME = 256 * 1024 * 1024  # a message: its document and its blobs
MAX_BLOBS = 1 << 16
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
        self.data = memoryview(data).cast("B")


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
    import numpy

    # Its bytes as they are (copied only when not contiguous); viewed as uint8, since the
    # buffer protocol refuses some plain dtypes (datetimes).
    data = numpy.ascontiguousarray(value).reshape(-1).view(numpy.uint8)
    return {
        "$": "ndarray",
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "blob": Blob(data),
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
    blobs: list[memoryview] = []

    def place(value: Any) -> int:
        if type(value) is not Blob:
            raise TypeError(f"{type(value).__name__} is not JSON serializable")
        blobs.append(value.data)
        return len(blobs) - 1

    data = json.dumps(doc, separators=(",", ":"), default=place).encode("utf-8", "surrogatepass")
    sizes = [blob.nbytes for blob in blobs]
    if len(data) + sum(sizes) > MAX_FRAME:
        raise WireError(
            f"a message of {len(data) + sum(sizes)} bytes is over the wire's {MAX_FRAME}"
        )
    if len(blobs) > MAX_BLOBS:
        raise WireError(
            f"a message of {len(blobs)} bytes-like values is over the wire's {MAX_BLOBS}"
        )
    head = struct.pack(f">II{len(sizes)}Q", len(data), len(sizes), *sizes)
    sock.sendall(head + data)
    for blob in blobs:
        sock.sendall(blob)


def recv(sock: socket.socket) -> dict[str, Any]:
    with _waiting_all(sock):
        return _recv(sock)


@contextlib.contextmanager
def _waiting_all(sock: socket.socket) -> Iterator[None]:
    """Reads that wait for all they ask (MSG_WAITALL), within the socket's timeout: a socket
    with a timeout is non-blocking underneath, where a read returns what has come so far (a
    bytes value then arrives in pieces that must be copied together)."""
    timeout = sock.gettimeout()
    if timeout is None:
        yield
        return
    seconds = max(timeout, 0.001)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
    try:
        yield
    except BlockingIOError:  # SO_RCVTIMEO ran out
        raise TimeoutError("timed out") from None
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
        sock.settimeout(timeout)


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))


def _recv(sock: socket.socket) -> dict[str, Any]:
    size, count = struct.unpack(">II", _exactly(sock, 8))
    if count > MAX_BLOBS:
        raise WireError(f"a message of {count} bytes-like values is over the wire's {MAX_BLOBS}")
    sizes = struct.unpack(f">{count}Q", _exactly(sock, 8 * count)) if count else ()
    if size + sum(sizes) > MAX_FRAME:
        raise WireError(f"a message of {size + sum(sizes)} bytes is over the wire's {MAX_FRAME}")
    named: dict[int, dict[str, Any]] = {}

    def blob_of(obj: dict[str, Any]) -> dict[str, Any]:
        if "blob" in obj:
            index = obj["blob"]
            if obj.get("$") not in BLOB_TAGS or type(index) is not int or index in named:
                raise WireError("a malformed blob")
            if not 0 <= index < count:
                raise WireError("a blob the message does not carry")
            named[index] = obj
        return obj

    doc = json.loads(_exactly(sock, size).decode("utf-8", "surrogatepass"), object_hook=blob_of)
    if type(doc) is not dict:
        raise WireError("a message that is not an object")
    if len(named) != count:
        raise WireError("a blob no value names")
    for index, blob_size in enumerate(sizes):
        obj = named[index]
        obj["blob"] = _exactly(sock, blob_size) if obj["$"] == "bytes" else _into(sock, blob_size)
    with contextlib.suppress(BlockingIOError, InterruptedError):
        if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
            raise WireError("a message longer than its length: one request at a time")
    return doc


def _exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes, read into one object (no copy when one read brings them all)."""
    if not size:
        return b""
    data = sock.recv(size, socket.MSG_WAITALL)
    if len(data) == size:
        return data
    if not data:
        raise Closed("the other side closed the wire")
    return data + bytes(_into(sock, size - len(data)))


def _into(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view, done = memoryview(data), 0
    while done < size:
        got = sock.recv_into(view[done:], size - done, socket.MSG_WAITALL)
        if not got:
            raise Closed("the other side closed the wire")
        done += got
    return data
