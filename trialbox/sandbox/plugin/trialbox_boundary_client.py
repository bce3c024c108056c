"""The boundary's wire client: the grader's one connection to the policy's process
(trialbox_boundary; standard library only).

A Policy holds the control socket to the zygote (trialbox_policy) and the stream to the
server the zygote handed it last: it asks for a server when it has none (at most MAX_SPAWNS),
sends one request at a time with the grading time left as its deadline, writes what the
policy's code printed, and raises what that code raised as a typed exception of the grader's.
Whatever goes wrong with the process itself (an exit, a signal, a deadline, a broken wire) is
PolicyDied. Which of the policy's objects become handles, and which handles become references
again, is the handles' (trialbox_boundary_handles.RemotePolicy); this module knows only the
wire's values.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import json
import socket
import sys
import time
from typing import Any

import trialbox_wire as wire

MAX_SPAWNS = 32
TIMED_OUT: list[bool] = []  # a call ran out of grading time: the run's status is `timeout`


class PolicyDied(BaseException):
    """The solution's process ended, or did not answer in time, during this call."""

    # The name a failed test's message shows: the boundary's (trialbox_boundary re-exports it).
    __module__ = "trialbox_boundary"


class PolicyTimeout(PolicyDied):
    __module__ = "trialbox_boundary"


class Policy(abc.ABC):
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
        sent = False
        try:
            sock.settimeout(self._remaining())
            wire.send(sock, request)
            sent = True
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
        except wire.WireError as exc:
            if not sent:
                raise  # the test's own value, too large to cross: refused before a byte went
            self._end(kill=True)
            raise PolicyDied(f"the solution's process broke the wire: {exc}") from None
        except Exception as exc:  # OSError, a malformed frame (ValueError, TypeError, ...)
            # Never answered again on this socket: what it left unread is no later reply.
            self._end(kill=True)
            raise PolicyDied(f"the solution's process broke the wire: {exc!r}") from None
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
        except PolicyDied:
            raise
        except Exception as exc:  # any malformed value: WireError, Overflow, ZeroDivision...
            raise PolicyDied(f"the solution's process sent a malformed value: {exc}") from None

    def encode(self, value: Any) -> Any:
        return wire.encode(value, self.ref_doc)

    @abc.abstractmethod
    def ref_doc(self, value: Any) -> dict[str, Any]:
        """The reference a handle of the grader's stands for; anything else is refused."""

    @abc.abstractmethod
    def proxy(self, doc: dict[str, Any]) -> Any:
        """What a reference from the policy's process becomes on the grader's side."""

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


def connect(current: Policy) -> None:
    """From here on, every request of the boundary's goes through `current`."""
    global _POLICY
    _POLICY = current
