"""The data-only wire between the grader and the policy's process (standard library only).

A frame is a 4-byte length and a JSON document. Plain values are JSON with a fixed set of tags
for what JSON lacks (tuples, sets, bytes, complex, dicts with any keys, numeric arrays); a tag
can never name a class, so decoding builds exact built-in types and nothing else. Whatever is
not a plain value crosses as a reference (`{"$": "ref", ...}`), which the policy's side makes
for its own objects and the grader's side turns into a remote handle.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from collections.abc import Callable
from typing import Any

MAX_FRAME = 256 * 1024 * 1024
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
        return {"$": kind.__name__, "v": base64.b64encode(value).decode()}
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
    data = value.tobytes(order="C")
    return {
        "$": "ndarray",
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "v": base64.b64encode(data).decode(),
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
        data = base64.b64decode(str(body), validate=True)
        return data if tag == "bytes" else bytearray(data)
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
        data = base64.b64decode(str(body), validate=True)
        return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()
    raise WireError(f"an unknown value tag {tag!r}")


def _list(body: Any) -> list[Any]:
    if type(body) is not list:
        raise WireError("a malformed container")
    return body


def _pair(body: Any) -> tuple[Any, Any]:
    if type(body) is not list or len(body) != 2:
        raise WireError("a malformed pair")
    return body[0], body[1]


def send(sock: socket.socket, doc: dict[str, Any]) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(data) > MAX_FRAME:
        raise WireError(f"a message of {len(data)} bytes is over the wire's {MAX_FRAME}")
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv(sock: socket.socket) -> dict[str, Any]:
    # One recv for the usual small message; the rest of a large one after it.
    head = sock.recv(1 << 16)
    if not head:
        raise Closed("the other side closed the wire")
    if len(head) < 4:
        head += _exactly(sock, 4 - len(head))
    (size,) = struct.unpack(">I", head[:4])
    if size > MAX_FRAME:
        raise WireError(f"a message of {size} bytes is over the wire's {MAX_FRAME}")
    body = head[4:]
    if len(body) > size:
        raise WireError("a message longer than its length: one request at a time")
    if len(body) < size:
        body += _exactly(sock, size - len(body))
    doc = json.loads(body.decode("utf-8", "surrogatepass"))
    if type(doc) is not dict:
        raise WireError("a message that is not an object")
    return doc


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise Closed("the other side closed the wire")
        chunks += chunk
    return bytes(chunks)
