"""The twin's function processes, forked from one warm parent per twin (a zygote) that has
already imported what every handler imports: the AWS SDK, Powertools, pydantic and the
project's models. A function process then pays for its own handler's init, not for starting
Python and importing boto3: a twin started eleven processes that did that, about 0.6 s of CPU
each, every time a test or `trialbox demo` started one.

Each child is still a process of its own with its function's own environment, set before it
imports its handler (handlers read it at import, as in Lambda). What the zygote imports reads
no setting that one function sets and another does not (tests/local/test_forks.py), and it
runs with the variables every function sets alike, not with its caller's environment.

The host and the zygote talk over one Unix socket of datagrams: a fork request carries the
child's argument list, its environment and its two pipe ends (SCM_RIGHTS); the zygote answers
each with the child's pid, and reports each child's exit code when it reaps it. When the host
goes (its end closes), or the zygote fails, the zygote kills what it forked and exits: no
function process outlives its twin, even mid-invocation. A zygote that died is replaced by the
host, and the processes it forked count as killed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from trialbox.local import models_cache

# What every handler imports (functions/*/handler.py). What they read at import is set the
# same for every function, or by none (tests/local/test_forks.py).
PRELOAD = (
    "boto3",
    "botocore.client",
    "aws_lambda_powertools",
    "aws_lambda_powertools.event_handler",
    "aws_lambda_powertools.metrics",
    "aws_lambda_powertools.utilities.batch",
    "aws_lambda_powertools.utilities.data_classes.sqs_event",
    "aws_xray_sdk.core",  # Tracer imports it, and it makes a botocore client at import
    "pydantic",
    "trialbox.models",
)
# The services the handlers make clients of: their models parsed once, here (models_cache).
MODELS = ("cloudwatch", "dynamodb", "ecs", "s3", "sqs", "stepfunctions")
MESSAGE_BYTES = 1 << 20  # one fork request: an argument list and an environment


class Forked:
    """A function process the zygote forked, as the host sees it (a subprocess.Popen's
    surface: its pipes, poll, kill, wait)."""

    def __init__(self, zygote: Zygote, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout

    @property
    def returncode(self) -> int | None:
        return self._zygote.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:  # not reaped yet: the pid is still this process's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        with self._zygote.exited:
            self._zygote.exited.wait_for(lambda: self.returncode is not None)
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return self.returncode  # type: ignore[return-value]


class Zygote:
    """The host's side of one zygote process: starts it, asks it for forks, and keeps the
    exit codes it reports (a reader thread). Once the zygote has gone (`gone`), the children
    it did not report are killed and count as killed, and it forks nothing more: the host
    starts another."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        # Datagrams with boundaries: one recv is one whole request or answer, however large.
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "trialbox.local.forks", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=[theirs.fileno()],
                env=env,
            )
        theirs.close()
        self.exits: dict[int, int] = {}
        self.exited = threading.Condition()
        self.gone = False
        self._live: set[int] = set()  # forked, no exit reported yet
        self._forked: queue.Queue[int] = queue.Queue()
        self._lock = threading.Lock()  # one fork request at a time: answers come in order
        threading.Thread(target=self._read, daemon=True, name="zygote-reader").start()

    def fork(self, argv: list[str], env: dict[str, str]) -> Forked:
        """A child running `serve(*argv)` with `env` as its whole environment."""
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        request = json.dumps({"argv": argv, "env": env}).encode()
        try:
            with self._lock:
                if self.gone:
                    raise RuntimeError("the function zygote has gone")
                socket.send_fds(self._socket, [request], [requests_read, answers_write])
                pid = self._forked.get()
            if pid < 0:
                raise RuntimeError(f"the function zygote has gone (exit {self._process.poll()})")
        except BaseException:
            os.close(requests_write)
            os.close(answers_read)
            raise
        finally:
            os.close(requests_read)
            os.close(answers_write)
        return Forked(self, pid, os.fdopen(requests_write, "wb"), os.fdopen(answers_read, "rb"))

    def _read(self) -> None:
        try:
            while data := self._socket.recv(MESSAGE_BYTES):
                message = json.loads(data)
                with self.exited:
                    if "forked" in message:  # a pid reused: its old exit is not this one's
                        self.exits.pop(message["forked"], None)
                        self._live.add(message["forked"])
                        self._forked.put(message["forked"])
                    else:
                        self.exits[message["pid"]] = message["code"]
                        self._live.discard(message["pid"])
                        self.exited.notify_all()
        except (OSError, ValueError):
            pass  # the zygote died mid-answer: as gone
        finally:
            with self.exited:
                self.gone = True
                for pid in self._live:  # nobody is left to report them: they end here
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    self.exits[pid] = -signal.SIGKILL
                self._live.clear()
                self.exited.notify_all()
            self._forked.put(-1)  # a fork request waiting fails

    def stop(self) -> None:
        """The zygote kills what it forked and exits."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._process.wait()


def _child(argv: list[str], env: dict[str, str], fds: list[int]) -> None:  # pragma: no cover
    """In the forked child: the function's pipes as stdin and stdout, its environment, and
    then its process's loop (trialbox.local.functions.serve)."""
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    from trialbox.local.functions import serve

    serve(*argv)


def main(control_fd: int) -> None:  # pragma: no cover - the zygote's own process
    for module in PRELOAD:
        importlib.import_module(module)
    models_cache.share(MODELS)
    children: set[int] = set()
    code = 1
    try:
        _serve(socket.socket(fileno=control_fd), children)
        code = 0
    finally:  # the host has gone, or this failed: its function processes go with it
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(code)


def _serve(control: socket.socket, children: set[int]) -> None:  # pragma: no cover
    """Fork a child for each request, and report each child's exit, until the host goes."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_read, False)
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector below
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)

    def send(message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            control.send(json.dumps(message).encode())

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            send({"pid": pid, "code": os.waitstatus_to_exitcode(status)})

    while True:
        for key, _ in selector.select():
            if key.fileobj is not control:
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup_read, 4096)
                reap()
                continue
            request, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2)
            if not request:
                return  # the host has gone
            wanted = json.loads(request)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    control.close()
                    os.close(wakeup_read)
                    os.close(wakeup_write)
                    _child(wanted["argv"], wanted["env"], fds)
                    code = 0
                except BaseException:
                    traceback.print_exc()  # into the function's log, once serve set it
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            send({"forked": pid})


if __name__ == "__main__":
    main(int(sys.argv[1]))
