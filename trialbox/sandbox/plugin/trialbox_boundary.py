"""The grader's side of the isolation boundary (`-p trialbox_boundary`; standard library only).

The policy's modules are never imported here. An import of one of the names the runner lists
(the workspace's top-level modules that shadow nothing of the runtime's or the hidden tests')
is answered by the policy's process (trialbox_policy): plain values arrive as exact
built-in values, everything else as a remote handle whose attribute access, calls and operators
go over the wire again, with the grading time left as their deadline. A test's
`subprocess.run` runs the program in the policy's process, as the policy's uid.

Equality with a handle is asked with the real value and DECOYS decoys shaped like it
(trialbox_decoy), in random order: an object equal to the real value and a decoy is flagged
`always_equal` and compares unequal; one that picks a single question to say yes to is right
once in DECOYS + 1. Without a decoy (an array, a value that cannot cross), `==` and `!=` fall
back to Python's own: unequal.

When the policy's process dies (os._exit, a signal, a deadline), the call waiting on it raises
PolicyDied, which no `except Exception` or `pytest.raises(Exception)` catches; the next test
gets a fresh process from the zygote (at most MAX_SPAWNS), so one crash costs only the tests
it was in. Handles from a dead process are gone; module attributes are looked up again by name.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import socket
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import trialbox_decoy
import trialbox_wire as wire

MAX_SPAWNS = 32
DECOYS = 3  # asked beside the expected value, for `handle == value`
POOL_SIZE = 5000  # the hidden tests' literals kept as plausible decoys
LITERAL_CHARS = 10_000
_PLAUSIBLE: list[Any] = []
REPR_CAP = 2000
FLAGS: list[str] = []  # integrity flags for the report (trialbox_report reads them)
TIMED_OUT: list[bool] = []  # a call ran out of grading time: the run's status is `timeout`


class PolicyDied(BaseException):
    """The solution's process ended, or did not answer in time, during this call."""


class PolicyTimeout(PolicyDied):
    pass


class Ref:
    __slots__ = ("generation", "handle", "kind", "name", "path")

    def __init__(self, generation: int, doc: dict[str, Any]) -> None:
        self.generation = generation
        self.handle = doc.get("id")
        path = doc.get("path")
        self.path = [str(p) for p in path] if isinstance(path, list) else None
        self.kind = str(doc.get("kind", "object"))
        self.name = str(doc.get("name", "object"))[:200]


class Policy:
    """The wire to the policy's current process, and the zygote that makes a new one."""

    def __init__(self, control_fd: int, budget_s: float) -> None:
        self.control = socket.socket(fileno=control_fd)
        self.deadline = time.monotonic() + budget_s
        self.sock: socket.socket | None = None
        self.pid = 0
        self.generation = 0
        self.spawns = 0
        self.classes: dict[tuple[Any, ...], type] = {}

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            TIMED_OUT.append(True)
            raise PolicyTimeout("no grading time is left for the solution's code")
        return left

    def _connect(self) -> socket.socket:
        if self.sock is not None:
            return self.sock
        if self.spawns >= MAX_SPAWNS:
            raise PolicyDied(f"the solution's process ended {MAX_SPAWNS} times; no more are made")
        self.spawns += 1
        try:
            self.control.settimeout(self._remaining())
            self.control.send(b'{"op": "spawn"}')
            message, fds, _, _ = socket.recv_fds(self.control, 4096, 1)
            if not fds:
                raise OSError("no descriptor came back")
            self.pid = int(json.loads(message)["pid"])
        except (OSError, ValueError, KeyError) as exc:
            raise PolicyDied(f"the solution's process could not be started: {exc}") from None
        self.sock = socket.socket(fileno=fds[0])
        self.generation += 1
        return self.sock

    def _end(self, kill: bool) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if kill:
            with contextlib.suppress(OSError):
                self.control.send(json.dumps({"op": "kill", "pid": self.pid}).encode())

    def ask(self, request: dict[str, Any]) -> Any:
        """One request; returns the reply's raw `ok` document, or raises what the policy's
        code raised (a built-in type, or a stand-in for its own class)."""
        sock = self._connect()
        try:
            sock.settimeout(self._remaining())
            wire.send(sock, request)
            reply = wire.recv(sock)
        except TimeoutError:
            self._end(kill=True)
            TIMED_OUT.append(True)
            raise PolicyTimeout(
                "the solution's code did not answer within the grading time"
            ) from None
        except wire.Closed:
            self._end(kill=False)
            raise PolicyDied(
                "the solution's process ended during this call (an exit, a signal or a crash)"
            ) from None
        except (OSError, ValueError) as exc:
            self._end(kill=True)
            raise PolicyDied(f"the solution's process broke the wire: {exc}") from None
        for stream, key in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
            text = reply.get(key)
            if isinstance(text, str) and text:
                stream.write(text)
        if "error" in reply:
            raise self.error(reply["error"])
        return reply.get("ok")

    # -- values ---------------------------------------------------------------------------
    def value(self, doc: Any) -> Any:
        try:
            return wire.decode(doc, self.proxy)
        except (wire.WireError, ValueError, TypeError, KeyError) as exc:
            raise PolicyDied(f"the solution's process sent a malformed value: {exc}") from None

    def encode(self, value: Any) -> Any:
        return wire.encode(value, self.ref_doc)

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

    def exception_class(self, chain: Any, base: Any) -> type:
        builtin = getattr(builtins, str(base), None)
        if not (isinstance(builtin, type) and issubclass(builtin, BaseException)):
            builtin = Exception
        cls: type = builtin
        for item in reversed(chain if isinstance(chain, list) else []):
            module, qualname = (str(p) for p in item[:2])
            key = ("exception", module, qualname)
            if key not in self.classes:
                attrs = {"__module__": module, "__qualname__": qualname}
                self.classes[key] = type(qualname.rsplit(".", 1)[-1], (cls,), attrs)
            cls = self.classes[key]
        return cls

    def error(self, doc: Any) -> BaseException:
        doc = doc if isinstance(doc, dict) else {}
        message = str(doc.get("message", ""))
        cls = self.exception_class(doc.get("chain"), doc.get("base"))
        if not issubclass(cls, Exception):  # SystemExit, KeyboardInterrupt...
            return PolicyDied(f"the solution's code raised {cls.__name__}: {message}")
        try:
            exc = cls(message) if cls is not StopIteration else cls(self.value(doc.get("value")))
        except Exception:
            exc = cls.__new__(cls)
            exc.args = (message,)
        trace = str(doc.get("traceback", ""))
        if trace:
            exc.add_note(f"(raised in the solution's process)\n{trace}")
        return exc


_POLICY: Policy | None = None


def policy() -> Policy:
    if _POLICY is None:
        raise PolicyDied("the isolation boundary is not set up")
    return _POLICY


def _ref_of(value: Any) -> Ref | None:
    ref: Ref | None = None
    if isinstance(value, RemoteObject):
        ref = object.__getattribute__(value, "_trialbox_ref")
    elif isinstance(value, RemoteClass):
        ref = type.__getattribute__(value, "_trialbox_ref")
    return ref


def _refused(name: str) -> bool:
    """Attributes a handle never forwards: dunders, and pytest's own probes."""
    return (name.startswith("__") and name.endswith("__")) or name.startswith(
        ("_pytest", "_fixture")
    )


def _getattr(ref: Ref, target: Any, name: str) -> Any:
    if _refused(name):
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
        decoys = trialbox_decoy.decoys(other, DECOYS, _PLAUSIBLE)
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


# -- imports ------------------------------------------------------------------------------
def _literals(tree: ast.AST) -> list[Any]:
    """The plain values the tests compare with or pass: plausible answers, for decoys."""
    found: list[Any] = []
    for node in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call):
            operands = list(node.args)
        for operand in operands:
            try:
                value = ast.literal_eval(operand)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if len(repr(value)) <= LITERAL_CHARS:
                found.append(value)
    return found


def _read_tests(root: Path) -> frozenset[str]:
    """Top-level names the hidden test modules bind (a star import never rebinds them); the
    values they compare with go to the decoys' pool."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        if len(_PLAUSIBLE) < POOL_SIZE:
            _PLAUSIBLE.extend(_literals(tree)[: POOL_SIZE - len(_PLAUSIBLE)])
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


class PolicyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the policy's modules, answered by its process."""

    def __init__(self, names: frozenset[str], shadowed: frozenset[str]) -> None:
        self.names = names
        self.shadowed = shadowed | frozenset(dir(builtins))

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] not in self.names:
            return None
        p = policy()
        described = p.ask({"op": "import", "name": fullname})
        if not isinstance(described, dict) or not described.get("found"):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=bool(described["package"]))
        spec.loader_state = described
        return spec

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        described = module.__spec__.loader_state  # type: ignore[union-attr]
        p = policy()
        attrs = described.get("attrs", {})
        for name, doc in attrs.items():
            setattr(module, str(name), p.value(doc))
        # Never a private or dunder name (`__builtins__` would replace the test module's).
        module.__all__ = [  # type: ignore[attr-defined]
            name
            for name in attrs
            if name not in self.shadowed and not name.startswith(("test", "Test", "_"))
        ]
        module_ref = {"$": "ref", "path": [module.__name__], "kind": "module"}

        def __getattr__(name: str) -> Any:
            if _refused(name):
                raise AttributeError(name)
            return p.value(p.ask({"op": "getattr", "target": module_ref, "name": name}))

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


# -- a test's subprocess ------------------------------------------------------------------
def _text(data: bytes | None, text: bool, encoding: str | None, errors: str | None) -> Any:
    if data is None or not text:
        return data
    stream = io.TextIOWrapper(io.BytesIO(data), encoding or "utf-8", errors, newline=None)
    return stream.read()


_REAL_RUN = subprocess.run
_HIDDEN: set[str] = set()  # the hidden files' paths in the grading tree


def _names_hidden_file(args: Any, cwd: Any) -> bool:
    """A command that names one of the task's hidden files (a checker script) is the task's
    own: it runs here, never in the policy's workspace, where the agent could plant its own."""
    words = args.split() if isinstance(args, str) else [os.fsdecode(a) for a in args]
    base = os.fsdecode(cwd) if cwd is not None else os.getcwd()
    return any(os.path.normpath(os.path.join(base, w)) in _HIDDEN for w in words)


def run(args: Any, **options: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, in the policy's process (check_output, call and friends use it), unless
    the command names a hidden file of the task."""
    if _names_hidden_file(args, options.get("cwd")):
        return _REAL_RUN(args, **options)
    text: bool = bool(options.pop("text", None) or options.pop("universal_newlines", None))
    encoding, errors = options.pop("encoding", None), options.pop("errors", None)
    text = text or encoding is not None or errors is not None
    data = options.pop("input", None)
    if isinstance(data, str):
        data = data.encode(encoding or "utf-8", errors or "strict")
    stdin = options.pop("stdin", None)
    if stdin not in (None, subprocess.DEVNULL, subprocess.PIPE):
        data = stdin.read() if hasattr(stdin, "read") else data
        data = data.encode() if isinstance(data, str) else data
    if options.pop("capture_output", False):
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
    stdout, stderr = options.pop("stdout", None), options.pop("stderr", None)
    timeout, check = options.pop("timeout", None), options.pop("check", False)
    shell, env = options.pop("shell", False), options.pop("env", None)
    for ignored in ("cwd", "close_fds", "bufsize", "executable", "start_new_session"):
        options.pop(ignored, None)
    if options:
        raise TypeError(f"subprocess options the boundary cannot honour: {sorted(options)}")
    argv = args if isinstance(args, str) else [os.fsdecode(a) for a in args]
    request = {
        "op": "run",
        "options": {
            "args": argv,
            "input": wire.encode(data, None) if data is not None else None,
            "capture": [stdout is not None, "stdout" if stderr == subprocess.STDOUT else True],
            "timeout": timeout,
            "shell": bool(shell),
            "env": dict(env) if env is not None else None,
        },
    }
    p = policy()
    done = p.ask(request)
    if not isinstance(done, dict):
        raise PolicyDied("the solution's process answered a subprocess with nothing")
    out = wire.decode(done.get("stdout"), None)
    err = wire.decode(done.get("stderr"), None)
    if done.get("timeout"):
        raise subprocess.TimeoutExpired(argv, timeout or 0, out, err)
    results = []
    for data_out, target in ((out, stdout), (err, stderr)):
        if target == subprocess.PIPE:
            results.append(_text(data_out, text, encoding, errors))
        else:
            if target is None and data_out:
                sys.stdout.write(bytes(data_out).decode(errors="replace"))
            results.append(None)
    completed = subprocess.CompletedProcess(argv, int(done["returncode"]), *results)
    if check:
        completed.check_returncode()
    return completed


def call(*args: Any, **options: Any) -> int:
    return run(*args, **options).returncode


def _install() -> None:
    global _POLICY
    fd = os.environ.pop("TRIALBOX_POLICY_FD", None)
    if fd is None:
        return
    spec_fd = int(os.environ.pop("TRIALBOX_POLICY_SPEC_FD"))
    with os.fdopen(spec_fd, "rb") as channel:
        spec = json.loads(channel.read())
    root = Path(os.environ.get("TRIALBOX_GRADING_ROOT", "."))  # trialbox_report pops it
    _HIDDEN.update(os.path.normpath(root / path) for path in spec["hidden"])
    _POLICY = Policy(int(fd), float(spec["budget_s"]))
    # First: a module of the policy's is never a local namespace package (the empty directory
    # its files left in the grading tree). The names shadow nothing of the runtime's or tests'.
    sys.meta_path.insert(0, PolicyModules(frozenset(spec["modules"]), _read_tests(root)))
    subprocess.run = run  # type: ignore[assignment]
    subprocess.call = call


_install()
