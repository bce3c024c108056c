"""The twin's Lambda: each function's real `functions/<name>/handler.py`, in processes of its
own with the function's own environment (handlers read it at import, as in Lambda), forked
from a warm zygote (trialbox.local.forks)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import queue
import struct
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import IO

from trialbox.local import limits, principals
from trialbox.local.forks import Forked, Zygote
from trialbox.local.resources import ACCOUNT, REGION, FunctionSpec

ROOT = Path(__file__).resolve().parents[2]  # a checkout's root, where functions/ lives


class Context:
    """What Powertools reads from a Lambda context."""

    def __init__(self, name: str, timeout_s: float = 300) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)


READY = b"ready"  # a function process's first frame: its init is done


def _frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _unframe(stream: IO[bytes]) -> bytes | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    body = stream.read(size)
    return body if len(body) == size else None  # cut short: the process died mid-answer


def serve(name: str, handler_path: str, log_path: str, timeout_s: str) -> None:
    """One function's process (trialbox.local.forks forks it): its environment is the
    function's own; stdin/stdout carry length-prefixed invocations."""
    requests_in, answers = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log  # Powertools' EMF metrics and JSON logs go here
    module, attr = handler_path.rsplit(".", 1)
    handler = getattr(importlib.import_module(module), attr)
    _frame(answers, READY)  # init is done: invocations are timed from here, as in Lambda
    while (payload := _unframe(requests_in)) is not None:
        try:
            out = handler(json.loads(payload or b"null"), Context(name, float(timeout_s)))
            _frame(answers, b"1" + json.dumps(out).encode())
        except Exception as exc:  # an unhandled function error, as Lambda reports it
            _frame(answers, b"0" + _error(type(exc).__name__, str(exc), exc))


def _error(error_type: str, message: str, exc: BaseException | None = None) -> bytes:
    trace = traceback.format_exception(exc)[-5:] if exc else []
    return json.dumps(
        {"errorType": error_type, "errorMessage": message, "stackTrace": trace}
    ).encode()


SCALE_OUT = 4  # a function scales out to at most this many times `copies` processes


def _pythonpath() -> dict[str, str]:
    """Where a function process imports from: the checkout (functions/) and this process's
    path."""
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


class Throttled(Exception):
    """No process of a function is free and it may start no more (Lambda's 429)."""


class FunctionHost:
    """One warm process per function at start; more as calls overlap, a cold start each, as
    Lambda scales out (a twin starts in half the time, and most of its functions never run two
    calls at once). A function scales out to `copies` processes, or to its reserved
    concurrency (at most 4 x `copies` here); at that bound, an invocation that may be
    throttled (a function URL's) raises Throttled, as Lambda answers 429, and the others wait.
    As in Lambda, an invocation that overruns the function's timeout is killed and reported as
    `Sandbox.Timedout`, and a process that dies (or is killed) is replaced by a fresh one for
    the next invocation."""

    def __init__(
        self, specs: dict[str, FunctionSpec], env: dict[str, str], log_dir: Path, copies: int = 2
    ) -> None:
        self.specs = {
            # Each function signs as itself: the request log then names its role.
            name: dataclasses.replace(
                spec,
                environment=spec.environment
                | env
                | {"AWS_ACCESS_KEY_ID": principals.function(name)},
            )
            for name, spec in specs.items()
        }
        self.log_dir = log_dir
        self.copies = copies
        self.idle: dict[str, queue.Queue[Forked]] = {}
        # Its reserved concurrency, within this machine's means; and how many it runs now.
        self.most = {
            name: min(spec.reserved or copies, SCALE_OUT * copies)
            for name, spec in self.specs.items()
        }
        self.live = {name: 1 for name in self.most}
        self.lock = threading.Lock()
        self.zygote: Zygote | None = None
        self.stopped = False

    def concurrency(self, name: str, bound: int | None) -> int:
        """How many invocations of `name` an event source runs at once: as many as it may
        have processes, within the source's `bound` (None: none)."""
        return min(self.most[name], bound or self.most[name])

    def start(self) -> None:
        """The zygote, then every process forked, then each one's init awaited (they import
        their handlers in parallel)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.zygote = self._zygote()
        started = {name: [self._spawn(name) for _ in range(self.live[name])] for name in self.specs}
        for name, processes in started.items():
            self.idle[name] = queue.Queue()
            for process in processes:
                self._await_init(name, process)
                self.idle[name].put(process)

    def shared_environment(self) -> dict[str, str]:
        """The variables every function sets, each to the same value: the zygote's."""
        each = [set(spec.environment.items()) for spec in self.specs.values()]
        return dict(set.intersection(*each)) if each else {}

    def stop(self) -> None:
        """Every function process killed, the zygote with them; nothing is forked again."""
        with self.lock:
            self.stopped = True
        if self.zygote is not None:
            self.zygote.stop()

    def _zygote(self) -> Zygote:
        return Zygote(self.shared_environment() | _pythonpath(), self.log_dir / "zygote.log")

    def _spawn(self, name: str) -> Forked:
        assert self.zygote is not None, "start() first"
        with self.lock:
            if self.stopped:
                raise RuntimeError("the function host has stopped")
            if self.zygote.gone:  # killed, say: a new one, as Lambda replaces a host
                self.zygote = self._zygote()
        spec = self.specs[name]
        argv = [name, spec.handler, str(self.log_dir / f"{name}.log"), str(spec.timeout_s)]
        return self.zygote.fork(argv, spec.environment | _pythonpath())

    def _await_init(self, name: str, process: Forked) -> None:
        assert process.stdout is not None
        if _unframe(process.stdout) != READY:
            log = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"function {name} failed to start:\n{log}")

    def _fresh(self, name: str) -> Forked:
        process = self._spawn(name)
        self._await_init(name, process)
        return process

    def _take(self, name: str, throttle: bool) -> Forked:
        pool = self.idle[name]
        with contextlib.suppress(queue.Empty):
            return pool.get_nowait()
        with self.lock:
            grow = self.live[name] < self.most[name]
            self.live[name] += grow
        if grow:
            try:
                return self._fresh(name)
            except BaseException:
                with self.lock:
                    self.live[name] -= 1
                raise
        if throttle:
            raise Throttled(name)
        return pool.get()

    def invoke(self, name: str, payload: bytes, *, throttle: bool = False) -> tuple[bool, bytes]:
        """A synchronous invocation, within Lambda's 6 MB each way (trialbox.local.limits)."""
        limits.check_lambda_request(payload)
        ok, answer = self._invoke(name, payload, throttle)
        too_large = limits.lambda_response_error(answer) if ok else None
        return (False, too_large) if too_large else (ok, answer)

    def _invoke(self, name: str, payload: bytes, throttle: bool) -> tuple[bool, bytes]:
        pool = self.idle[name]
        process = self._take(name, throttle)
        if process.poll() is not None:  # died while idle: Lambda would start a new one
            process = self._fresh(name)
        timeout_s = self.specs[name].timeout_s
        timed_out = threading.Event()

        def overrun() -> None:
            timed_out.set()
            process.kill()

        watchdog = threading.Timer(timeout_s, overrun)
        watchdog.start()
        try:
            assert process.stdin is not None and process.stdout is not None
            with contextlib.suppress(OSError):
                _frame(process.stdin, payload)
            answer = _unframe(process.stdout)
        finally:
            watchdog.cancel()
        if answer and not timed_out.is_set():
            pool.put(process)
            return answer[:1] == b"1", answer[1:]
        process.kill()  # overran (an answer racing the kill is late all the same), or died
        process.wait()
        pool.put(self._fresh(name))
        if timed_out.is_set():
            message = f"Task timed out after {timeout_s:.2f} seconds"
            return False, _error("Sandbox.Timedout", message)
        message = f"{name} exited with {process.returncode} before answering"
        return False, _error("Runtime.ExitError", message)
