"""The boundary's remote handles: how the tests see the policy's objects (trialbox_boundary;
standard library only).

An object of the policy's that is not a plain value arrives as a handle (RemoteObject) whose
attribute access, calls and operators go over the wire again; a class arrives as a stand-in
class (its metaclass RemoteClass) whose calls build the object remotely and whose isinstance
asks the policy's process. RemotePolicy is the wire client that makes them, and that turns
them back into references when a test hands one to the policy's code. A handle never forwards
a dunder attribute or one of pytest's probes, and takes part in arithmetic and ordering only
with other handles. Equality with a plain value is asked among decoys (trialbox_decoy), in
random order: an object equal to the value and to a decoy is flagged `always_equal`.
"""

from __future__ import annotations

from typing import Any

import trialbox_decoy
import trialbox_wire as wire
from trialbox_boundary_client import Policy, PolicyDied, policy

DECOYS = 3  # asked beside the expected value, for `handle == value`
PLAUSIBLE: list[Any] = []  # the hidden tests' literals (trialbox_boundary_imports.read_tests)
REPR_CAP = 2000
FLAGS: list[str] = []  # integrity flags for the report (trialbox_report reads them)


class Ref:
    __slots__ = ("generation", "handle", "kind", "name", "path")

    def __init__(self, generation: int, doc: dict[str, Any]) -> None:
        self.generation = generation
        self.handle = doc.get("id")
        path = doc.get("path")
        self.path = [str(p) for p in path] if isinstance(path, list) else None
        self.kind = str(doc.get("kind", "object"))
        self.name = str(doc.get("name", "object"))[:200]


class RemotePolicy(Policy):  # type: ignore[misc]  # the plugin's modules are Any to mypy
    """The wire client whose references are handles: the one the boundary connects."""

    def ref_doc(self, value: Any) -> dict[str, Any]:
        ref = _ref_of(value)
        if ref is None:
            refused: dict[str, Any] = wire.encode(value, None)  # raises: never crosses
            return refused
        if ref.generation == self.generation and self.sock is not None:
            return {"$": "ref", "id": ref.handle}
        if ref.path is not None:
            return {"$": "ref", "path": ref.path}
        raise PolicyDied("this object came from a solution process that has ended")

    def proxy(self, doc: dict[str, Any]) -> Any:
        ref = Ref(self.generation, doc)
        if ref.kind == "exception":
            return self.exception_class(doc.get("chain"), doc.get("base"))
        if ref.kind == "class":
            key = tuple(ref.path) if ref.path else (ref.generation, ref.handle)
            if key not in self.classes:
                name = ref.name.rsplit(".", 1)[-1]
                self.classes[key] = RemoteClass(name, (), {"_trialbox_ref": ref})
            return self.classes[key]
        return RemoteObject(ref)


def _ref_of(value: Any) -> Ref | None:
    ref: Ref | None = None
    if isinstance(value, RemoteObject):
        ref = object.__getattribute__(value, "_trialbox_ref")
    elif isinstance(value, RemoteClass):
        ref = type.__getattribute__(value, "_trialbox_ref")
    return ref


def refused(name: str) -> bool:
    """Attributes a handle never forwards: dunders, and pytest's own probes."""
    return (name.startswith("__") and name.endswith("__")) or name.startswith(
        ("_pytest", "_fixture")
    )


def _getattr(ref: Ref, target: Any, name: str) -> Any:
    if refused(name):
        raise AttributeError(name)
    p = policy()
    return p.value(p.ask({"op": "getattr", "target": p.ref_doc(target), "name": name}))


def _call(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    p = policy()
    try:
        request = {
            "op": "call",
            "target": p.ref_doc(target),
            "args": [p.encode(a) for a in args],
            "kwargs": {str(k): p.encode(v) for k, v in kwargs.items()},
        }
    except wire.WireError as exc:
        raise TypeError(str(exc)) from None
    return p.value(p.ask(request))


# Arithmetic and ordering between an object of the solution's and a plain value of the test's:
# an honest value is plain (numbers, Fraction and Decimal cross as values), so only a rigged
# object would take part (`abs(result - expected) < eps` answered by the object itself).
_MIXED = "lt le gt ge add sub mul matmul truediv floordiv mod pow lshift rshift and_ or_ xor"
MIXED = frozenset([*_MIXED.split(), "divmod"])


def _op(target: Any, name: str, *args: Any, reflected: bool = False) -> Any:
    p = policy()
    if name in MIXED and any(_ref_of(a) is None for a in args):
        ref = _ref_of(target)
        kind = ref.name if ref is not None else "object"
        raise TypeError(
            f"the solution gave a {kind!r} object where a value was expected: under the "
            "isolation boundary its objects take part in arithmetic and ordering only with "
            "each other (a task that needs more sets grading.isolation: in_process)"
        )
    try:
        encoded = [p.encode(a) for a in args]
    except wire.WireError as exc:
        raise TypeError(str(exc)) from None
    request: dict[str, Any] = {
        "op": "op", "name": name, "target": p.ref_doc(target), "args": encoded
    }  # fmt: skip
    if reflected:
        request["reflected"] = True
    return p.value(p.ask(request))


def _truthy(value: Any) -> bool:
    return bool(value)  # a handle's truth is asked of its own process


class RemoteObject:
    """A handle on an object of the policy's process."""

    __slots__ = ("_trialbox_ref",)

    def __init__(self, ref: Ref) -> None:
        object.__setattr__(self, "_trialbox_ref", ref)

    def __getattr__(self, name: str) -> Any:
        return _getattr(object.__getattribute__(self, "_trialbox_ref"), self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        p = policy()
        try:
            args = [p.encode(value)]
        except wire.WireError as exc:
            raise TypeError(str(exc)) from None
        p.ask({"op": "setattr", "target": p.ref_doc(self), "name": name, "args": args})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self, args, kwargs)

    def __repr__(self) -> str:
        ref = object.__getattribute__(self, "_trialbox_ref")
        try:
            text = _op(self, "repr")
        except PolicyDied:
            return f"<{ref.name} from the solution's ended process>"
        return text[:REPR_CAP] if isinstance(text, str) else f"<{ref.name}>"

    def __str__(self) -> str:
        text = _op(self, "str")
        if not isinstance(text, str):
            raise TypeError("__str__ returned a non-string")
        return text

    def __eq__(self, other: Any) -> Any:
        if _ref_of(other) is not None:
            return _truthy(_op(self, "eq", other))
        try:
            policy().encode(other)
        except wire.WireError:
            return NotImplemented
        decoys = trialbox_decoy.decoys(other, DECOYS, PLAUSIBLE)
        if not decoys:  # no decoy (an array): its own elementwise ==
            return NotImplemented
        # The questions in random order: the policy cannot tell the real one, so an object
        # that says yes to one of them only is right by chance once in DECOYS + 1.
        questions = [other, *decoys]
        order = trialbox_decoy.RNG.sample(range(len(questions)), len(questions))
        answers = {i: _truthy(_op(self, "eq", questions[i])) for i in order}
        real = answers.pop(0)
        if real and any(answers.values()):
            ref = object.__getattribute__(self, "_trialbox_ref")
            FLAGS.append(f"always_equal: a {ref.name} from the solution equals anything")
            return False
        return real

    def __ne__(self, other: Any) -> Any:
        equal = self.__eq__(other)  # NotImplemented (no decoy): Python's fallback, unequal
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        value = _op(self, "hash")
        if type(value) is not int:
            raise TypeError("__hash__ returned a non-integer")
        return value

    def __bool__(self) -> bool:
        return bool(_op(self, "bool"))

    def __len__(self) -> int:
        return int(_op(self, "len"))

    def __iter__(self) -> Any:
        return _op(self, "iter")

    def __next__(self) -> Any:
        return _op(self, "next")

    def __contains__(self, item: Any) -> bool:
        return bool(_op(self, "contains", item))

    def __getitem__(self, key: Any) -> Any:
        return _op(self, "getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        _op(self, "setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        _op(self, "delitem", key)

    def __int__(self) -> int:
        return int(_op(self, "int"))

    def __float__(self) -> float:
        return float(_op(self, "float"))

    def __index__(self) -> int:
        return int(_op(self, "index"))

    def __round__(self, *args: Any) -> Any:
        return _op(self, "round", *args)

    def __format__(self, spec: str) -> str:
        text = _op(self, "format", spec)
        if not isinstance(text, str):
            raise TypeError("__format__ returned a non-string")
        return text


def _binary(name: str, reflected: bool = False) -> Any:
    def method(self: RemoteObject, other: Any) -> Any:
        return _op(self, name, other, reflected=reflected)

    return method


def _unary(name: str) -> Any:
    def method(self: RemoteObject) -> Any:
        return _op(self, name)

    return method


for _name in ["lt", "le", "gt", "ge"]:
    setattr(RemoteObject, f"__{_name}__", _binary(_name))
for _name in [
    "divmod",
    "add",
    "sub",
    "mul",
    "matmul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "lshift",
    "rshift",
    "and",
    "or",
    "xor",
]:
    _func = _name + "_" if _name in ("and", "or") else _name
    setattr(RemoteObject, f"__{_name}__", _binary(_func))
    setattr(RemoteObject, f"__r{_name}__", _binary(_func, reflected=True))
for _name in ["neg", "pos", "abs", "invert"]:
    setattr(RemoteObject, f"__{_name}__", _unary(_name))


class RemoteClass(type):
    """The metaclass of a stand-in for one of the policy's classes: calling it builds an
    instance in the policy's process; isinstance asks that process."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return _call(cls, args, kwargs)

    def __getattr__(cls, name: str) -> Any:
        return _getattr(type.__getattribute__(cls, "_trialbox_ref"), cls, name)

    def __instancecheck__(cls, instance: Any) -> bool:
        if not isinstance(instance, RemoteObject):
            return False
        p = policy()
        request = {"op": "isinstance", "target": p.ref_doc(instance), "cls": p.ref_doc(cls)}
        return p.ask(request) is True

    def __repr__(cls) -> str:
        return f"<class {cls.__qualname__!r} of the solution>"
