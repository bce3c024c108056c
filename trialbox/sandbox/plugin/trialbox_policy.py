"""The policy's side of the isolation boundary: `python -P -m trialbox_policy`, run by the
runner at grading as the agent's uid, in the agent's workspace, never in the grader's tree.

The main process is a zygote: it imports nothing of the policy's and forks one server per
`spawn` the grader asks for on the control socket, handing the grader the server's end of a
fresh stream socket (SCM_RIGHTS). A server imports the policy's modules and answers requests
with plain values, references to its own objects, or a description of the exception its code
raised. The policy's code owns this process and may rewrite all of it: nothing here is trusted,
and nothing it sends can be more than data to the grader.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import io
import json
import operator
import os
import signal
import socket
import sys
from typing import Any

import trialbox_wire as wire

OUTPUT_CAP = 1 << 20
TEXT_CAP = 4000
_OPERATOR_NAMES = (
    "eq ne lt le gt ge add sub mul matmul truediv floordiv mod pow lshift rshift and_ or_ xor "
    "neg pos abs invert index contains getitem setitem delitem"
)
OPERATORS: dict[str, Any] = {name: getattr(operator, name) for name in _OPERATOR_NAMES.split()}
BUILTINS: dict[str, Any] = {
    "len": len, "iter": iter, "next": next, "bool": bool, "hash": hash, "repr": repr,
    "str": str, "int": int, "float": float, "complex": complex, "round": round,
    "format": format, "divmod": divmod,
}  # fmt: skip


class CappedText(io.TextIOBase):
    """What the policy's code prints during one call, capped."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.size < OUTPUT_CAP:
            self.parts.append(text[: OUTPUT_CAP - self.size])
            self.size += len(self.parts[-1])
        return len(text)

    def value(self) -> str:
        return "".join(self.parts)


_CONVERSIONS: tuple[tuple[type, Any], ...] = (
    (bool, bool),
    (int, int.__index__),
    (float, float.__float__),
    (complex, complex.__complex__),
    (str, str.__str__),
    (bytes, lambda v: bytes(memoryview(v))),
    (list, lambda v: list(list.__iter__(v))),
    (dict, lambda v: dict(dict.items(v))),
    (set, lambda v: set(set.__iter__(v))),
    (frozenset, lambda v: frozenset(frozenset.__iter__(v))),
)


def _plain_base(value: Any) -> Any:
    """A subclass of a built-in value type crosses as the base value (its overrides stay
    behind), except a namedtuple, whose fields a test may read by name."""
    for base, convert in _CONVERSIONS:
        if isinstance(value, base):
            return convert(value)
    if isinstance(value, tuple) and not hasattr(type(value), "_fields"):
        return tuple(tuple.__iter__(value))
    if type(value).__module__ == "numpy" and hasattr(value, "item") and not hasattr(value, "shape"):
        return value.item()
    return None


class Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.objects: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(object) -> handle, for objects kept alive here

    # -- references -----------------------------------------------------------------------
    def ref(self, value: Any, path: list[str] | None = None) -> dict[str, Any]:
        plain = _plain_base(value)
        if plain is not None and type(plain) is not type(value):
            encoded: dict[str, Any] = wire.encode(plain, self.ref)
            return encoded
        handle = self.ids.get(id(value))
        if handle is None:
            handle = len(self.objects) + 1
            self.objects[handle] = value
            self.ids[id(value)] = handle
        doc: dict[str, Any] = {"$": "ref", "id": handle, "kind": _kind(value)}
        doc["name"] = str(getattr(value, "__qualname__", type(value).__qualname__))[:200]
        if path is not None:
            doc["path"] = path
        if isinstance(value, type) and issubclass(value, BaseException):
            doc["chain"], doc["base"] = _exception_chain(value)
        return doc

    def resolve(self, doc: dict[str, Any]) -> Any:
        """By handle when the grader has one from this process, else by name (a module
        attribute a process before this one handed out)."""
        if "id" in doc:
            if doc["id"] not in self.objects:
                raise wire.WireError("a reference this process never made")
            return self.objects[doc["id"]]
        path = doc.get("path")
        if not isinstance(path, list) or not path:
            raise wire.WireError("a reference without a handle or a name")
        value: Any = importlib.import_module(str(path[0]))
        for name in path[1:]:
            value = getattr(value, str(name))
        return value

    def out(self, value: Any, path: list[str] | None = None) -> Any:
        """A value as it crosses; `path` names it for a later process (a module attribute)."""
        return wire.encode(value, lambda v: self.ref(v, path if v is value else None))

    # -- requests -------------------------------------------------------------------------
    def warm_up(self) -> None:
        """What a first request runs, on a module of the server's own, while it waits: the
        pages the fork shares are copied now, not during the grader's first call."""
        importlib.machinery.PathFinder.find_spec("_trialbox_warm_up", sys.path[:1])
        with contextlib.suppress(Exception):
            json.loads(json.dumps(self.describe_module(wire.__name__)))
        self.objects.clear()
        self.ids.clear()

    def serve(self) -> None:
        while True:
            try:
                request = wire.recv(self.sock)
            except (wire.Closed, OSError):
                os._exit(0)
            # What the policy's code prints during the call goes back with the reply.
            sys.stdout, sys.stderr = stdout, stderr = CappedText(), CappedText()
            try:
                reply: dict[str, Any] = {"ok": self.handle(request)}
            except BaseException as exc:  # the policy's code raised: the grader gets a copy
                reply = {"error": _describe(exc)}
            if stdout.size or stderr.size:
                reply["stdout"], reply["stderr"] = stdout.value(), stderr.value()
            try:
                wire.send(self.sock, reply)
            except (wire.WireError, ValueError, TypeError) as exc:  # too large, say
                wire.send(self.sock, {"error": _describe(exc)})

    def handle(self, request: dict[str, Any]) -> Any:
        op = request.get("op")
        args = [wire.decode(a, self.resolve) for a in request.get("args", [])]
        if op == "import":
            return self.describe_module(str(request["name"]))
        if op == "getattr":
            target = self.resolve(request["target"])
            name = str(request["name"])
            path = request["target"].get("path")
            return self.out(getattr(target, name), [*path, name] if path else None)
        if op == "setattr":
            setattr(self.resolve(request["target"]), str(request["name"]), args[0])
            return None
        if op == "call":
            kwargs = {str(k): wire.decode(v, self.resolve) for k, v in request["kwargs"].items()}
            return self.out(self.resolve(request["target"])(*args, **kwargs))
        if op == "op":
            name = str(request["name"])
            func = OPERATORS.get(name) or BUILTINS.get(name)
            if func is None:
                raise wire.WireError(f"no operation {name!r}")
            target = self.resolve(request["target"])
            if request.get("reflected"):
                return self.out(func(args[0], target))
            return self.out(func(target, *args))
        if op == "isinstance":
            return isinstance(self.resolve(request["target"]), self.resolve(request["cls"]))
        if op == "run":
            return self.run(request)
        raise wire.WireError(f"no request {op!r}")

    def describe_module(self, name: str) -> dict[str, Any]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                return {"found": False}
            raise
        names = getattr(module, "__all__", None)
        if not (isinstance(names, (list, tuple)) and all(type(n) is str for n in names)):
            names = [n for n in vars(module) if not n.startswith("_")]
        attrs = {}
        for attr in names:
            if hasattr(module, attr):
                attrs[attr] = self.out(getattr(module, attr), [name, attr])
        return {"found": True, "names": list(names), "attrs": attrs,
                "package": hasattr(module, "__path__")}  # fmt: skip

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """A test's subprocess, run here: as the policy's uid, in the policy's workspace."""
        import subprocess

        options = request["options"]
        capture = options.get("capture", [True, True])
        stderr: int = subprocess.DEVNULL
        if capture[1] == "stdout":
            stderr = subprocess.STDOUT
        elif capture[1]:
            stderr = subprocess.PIPE
        try:
            done = subprocess.run(
                options["args"],
                input=wire.decode(options.get("input"), None),
                stdout=subprocess.PIPE if capture[0] else subprocess.DEVNULL,
                stderr=stderr,
                timeout=options.get("timeout"),
                shell=bool(options.get("shell")),
                env=options.get("env"),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return {"timeout": True, "stdout": wire.encode(exc.stdout or b"", None),
                    "stderr": wire.encode(exc.stderr or b"", None)}  # fmt: skip
        return {
            "returncode": done.returncode,
            "stdout": wire.encode(done.stdout or b"", None),
            "stderr": wire.encode(done.stderr or b"", None),
        }


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return "exception" if issubclass(value, BaseException) else "class"
    if isinstance(value, type(sys)):
        return "module"
    if callable(value):
        return "function"
    return "object"


def _exception_chain(cls: type) -> tuple[list[list[str]], str]:
    """The policy's own classes from `cls` up, and the first built-in exception above them."""
    chain: list[list[str]] = []
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            return chain, klass.__name__
        chain.append([str(klass.__module__), str(klass.__qualname__)])
    return chain, "Exception"


def _describe(exc: BaseException) -> dict[str, Any]:
    chain, base = _exception_chain(type(exc))
    try:
        message = str(exc)[:TEXT_CAP]
    except BaseException:
        message = "(the exception's message could not be read)"
    trace = exc.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
        trace = trace.tb_next  # the server's own frames: only the policy's code is of interest
    return {
        "chain": chain,
        "base": base,
        "message": message,
        "traceback": _traceback(exc, trace),
        "value": _stop_value(exc),
    }


def _traceback(exc: BaseException, trace: Any) -> str:
    """The policy's frames, formatted; "" when none raised it (a missing attribute, a wrong
    number of arguments): the usual probe of a test or of pytest then costs no formatting."""
    if trace is None and exc.__cause__ is None and exc.__context__ is None:
        return ""
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, trace))[-TEXT_CAP:]


def _stop_value(exc: BaseException) -> Any:
    if isinstance(exc, StopIteration):
        with contextlib.suppress(wire.WireError):
            return wire.encode(exc.value, None)
    return None


def zygote() -> None:
    control = socket.socket(fileno=int(os.environ.pop("TRIALBOX_POLICY_FD")))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # servers are never waited for
    spare = _fork_server(control)
    while True:
        message = control.recv(4096)
        if not message:
            return
        request = json.loads(message)
        if request.get("op") == "kill":
            with contextlib.suppress(OSError):
                os.kill(int(request["pid"]), signal.SIGKILL)
            continue
        pid, theirs = spare
        socket.send_fds(control, [json.dumps({"pid": pid}).encode()], [theirs.fileno()])
        theirs.close()
        spare = _fork_server(control)


def _fork_server(control: socket.socket) -> tuple[int, socket.socket]:
    """A server forked ahead of the grader's `spawn`, so a spawn costs no fork: it has run
    nothing of the policy's, as if forked on demand, and readies the import machinery for
    the workspace while it waits (what the first `import solution` would pay for)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        control.close()
        theirs.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sys.path.insert(0, os.getcwd())
        server = Server(ours)
        server.warm_up()
        server.serve()
        os._exit(0)
    ours.close()
    return pid, theirs


if __name__ == "__main__":
    zygote()
