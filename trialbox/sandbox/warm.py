"""Warm processes on the rlimit backend: a sample pays for its own code and tests, not for
starting Python and importing pytest.

A cold grading command is a reaper's interpreter, then prlimit, setpriv and a new interpreter
that imports pytest and its plugins: most of a small sample's CPU. Per slot and per kind of
command (the grader's pytest, the policy's zygote) the backend keeps a warm process instead
(warm_process.py): the runtime's `python -P`, started as root with the environment a cold
command of that kind gets, its module already imported. Each command is a fork of it, which
becomes the slot uid as a cold command does and runs the module; the warm process itself never
runs a sample's code, so nothing a sample does reaches the next (tests/sandbox/test_warm.py).

A command is warm only when a cold start would give it the same interpreter: `python -P -m
MODULE` with MODULE one of WARM_MODULES, `python` on its PATH the runtime's, and the same
environment as the warm process's but for the TRIALBOX_ variables (descriptor numbers, read
at run time). Any other command, or a warm process that is gone or cannot answer, starts
cold; a warm process that failed a launch is replaced, never reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from trialbox.errors import SandboxError
from trialbox.sandbox import reaper
from trialbox.sandbox.runtime import POLICY_MODULE

WARM_MODULES = frozenset({"pytest", POLICY_MODULE})
PROGRAM = Path(__file__).with_name("warm_process.py")
# The program is imported from its directory (warm_process imports reaper_process from there
# too), which then leaves sys.path: the command's interpreter has the path a cold `python -P -m`
# has. argv: those directories, the program's module, then its own arguments.
BOOT = (
    "import importlib, sys; places = sys.argv[1].split(':'); sys.path[:0] = places; "
    "program = importlib.import_module(sys.argv[2]); del sys.path[: len(places)]; "
    "program.main(sys.argv[3:])"
)
READY_S = 60.0  # the runtime's interpreter and its pytest import, on a loaded machine
ANSWER_S = 10.0
PER_RUN = "TRIALBOX_"
# A pytest one is ~30 MiB resident, a policy one ~10: a runner keeps to a few slots (slots.py).
MAX_SERVERS = 8
# Set by each command for itself: the warm process, root, has a HOME and TMPDIR no slot uid
# may write (nothing it imports should read a file a sample planted).
OWN_PLACES = {"HOME": "/", "TMPDIR": "/"}


class WarmLost(OSError):
    """A command was sent and its warm process did not answer: what it started may run."""


def warm_module(argv: tuple[str, ...], env: dict[str, str], python: Path) -> str | None:
    """The module a warm process could run this command as, or None: it starts cold."""
    if len(argv) < 4 or argv[0] != "python" or argv[1:3] != ("-P", "-m"):
        return None
    if argv[3] not in WARM_MODULES:
        return None
    if shutil.which("python", path=env.get("PATH", "")) != str(python):
        return None
    return argv[3]


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """What of a command's environment its interpreter's start could depend on (its HOME
    and TMPDIR are read later, from the environment the command gets)."""
    return {k: v for k, v in env.items() if not k.startswith(PER_RUN)} | OWN_PLACES


@dataclass(frozen=True, kw_only=True)
class WarmCommand:
    """What a warm process needs to start a command as a cold start would."""

    argv: tuple[str, ...]
    uid: int
    cwd: Path  # the command's working directory (on bwrap, inside its sandbox)
    env: dict[str, str]
    fds: list[int]  # passed at these numbers, which `env` names
    rlimits: list[tuple[int, int]] = field(default_factory=list)  # (RLIMIT_*, both limits)
    # bwrap: a pidfd of the sandbox's holder and the cgroup procs files to join (this side's
    # copies are closed once sent).
    enter: list[int] = field(default_factory=list)
    nice: int = reaper.SANDBOX_NICE


class WarmProc:
    """The forked reaper, as `reaper.Reaped` uses a Popen: its pipes, kill and end. It is the
    warm process's child, so its exit status is not ours to read (`wait` answers -1)."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self._pidfd = os.pidfd_open(
            pid
        )  # the reaper is a zombie at worst until its parent's next request
        self.stdout: IO[bytes] | None = os.fdopen(stdout, "rb", buffering=0)
        self.stderr: IO[bytes] | None = os.fdopen(stderr, "rb", buffering=0)

    def kill(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.wait(0) if self._pidfd < 0 or self._ended(0) else None

    def _ended(self, timeout: float | None) -> bool:
        return bool(select.select([self._pidfd], [], [], timeout)[0])

    def wait(self, timeout: float | None = None) -> int:
        if self._pidfd >= 0:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired("warm reaper", timeout or 0)
            os.close(self._pidfd)
            self._pidfd = -1
        return -1


class WarmServer:
    """One warm process: `module` imported, `env` its environment."""

    def __init__(
        self, python: Path, module: str, env: dict[str, str], program: Path = PROGRAM
    ) -> None:
        self.module = module
        self.launched = 0  # commands forked from it
        self.env = startup_env(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        self._lock = threading.Lock()
        try:
            self.proc = subprocess.Popen(
                [
                    *(str(python), "-P", "-c", BOOT),
                    ":".join(sorted({str(program.parent), str(PROGRAM.parent)})),
                    program.stem,
                    *(str(theirs.fileno()), module),
                ],
                env=self.env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
            )
        finally:
            theirs.close()
        ours.settimeout(READY_S)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        word, _, shared_kib = ready.partition(b" ")
        # What each command forked from it still shares with it once it ran (warm_process).
        self.shared_mb = int(shared_kib) / 1024 if shared_kib.isdigit() else 0.0
        if word != b"ready":
            said = self._stderr()
            self.close()
            raise SandboxError(f"the warm {module} process did not start: {said}")
        ours.settimeout(ANSWER_S)

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        if select.select([self.proc.stderr], [], [], 0)[0]:
            said = os.read(self.proc.stderr.fileno(), 4096)
            return said.decode(errors="replace").strip()[-2000:]
        return f"exit {self.proc.poll()}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def launch(self, command: WarmCommand) -> reaper.Reaped:
        """The command forked from this process, as `reaper.start` starts one cold. OSError:
        this process failed to answer (close it; the command did not start)."""
        status_r, status_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {
            "argv": list(command.argv),
            "uid": command.uid,
            "nice": command.nice,
            "filter": reaper.filter_hex(),
            "cwd": str(command.cwd),
            "env": command.env,
            "fds": command.fds,
            "rlimits": [list(limit) for limit in command.rlimits],
        }
        try:
            with self._lock:
                passing = [out_w, err_w, status_w, *command.fds, *command.enter]
                socket.send_fds(self.control, [json.dumps(request).encode()], passing)
                try:
                    answer = self.control.recv(4)
                except OSError as exc:
                    raise WarmLost(f"the warm process did not answer: {exc}") from exc
                self.launched += 1
            if len(answer) != 4:
                raise WarmLost("the warm process closed its control socket")
            proc = WarmProc(int.from_bytes(answer, "little"), out_r, err_r)
        except BaseException:
            for fd in (status_r, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (status_w, out_w, err_w):
                os.close(fd)
        return reaper.attach(proc, status_r)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class WarmPool:
    """A backend's warm processes, by slot and module; replaced when gone, broken or started
    for another environment. At most MAX_SERVERS: past it, the one used longest ago ends."""

    def __init__(self, python: Path, program: Path = PROGRAM) -> None:
        self.python = python
        self.program = program  # another only for tests: one that runs samples itself
        self._servers: dict[tuple[int, str], WarmServer] = {}
        # (module, environment) a warm process failed to start with: its commands start cold
        # (a cold start of the same would fail the same way, as the command's own failure).
        self._failed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def launch(self, slot: int, module: str, command: WarmCommand) -> reaper.Reaped | None:
        """The command, forked from the slot's warm process; None when none could take it
        (the caller starts it cold)."""
        server = self.ready(slot, module, command.env)
        if server is None:
            return None
        try:
            return server.launch(command)
        except WarmLost as exc:
            # The command may have started, with the descriptors that were passed to it: not
            # one more may. The sandbox's failure; the slot's sweep kills what it left.
            self._drop(slot, module, server)
            raise SandboxError(str(exc)) from exc
        except OSError:  # nothing was sent: it starts cold
            self._drop(slot, module, server)
            return None

    def server(self, slot: int, module: str) -> WarmServer | None:
        """The slot's warm process for `module`, if it has one."""
        return self._servers.get((slot, module))

    def ready(self, slot: int, module: str, env: dict[str, str]) -> WarmServer | None:
        """The slot's warm process for `module`, started for `env` when it has none (or one
        that is gone or was started for another); None when none can start."""
        with self._lock:
            server = self._servers.get((slot, module))
            if server is not None and server.alive() and server.env == startup_env(env):
                self._servers[(slot, module)] = self._servers.pop((slot, module))  # most recent
                return server
            if server is not None:
                server.close()
                del self._servers[(slot, module)]
            key = (module, json.dumps(startup_env(env), sort_keys=True))
            if key in self._failed:
                return None
            try:
                server = WarmServer(self.python, module, env, self.program)
            except (OSError, SandboxError):
                self._failed.add(key)
                return None
            self._servers[(slot, module)] = server
            while len(self._servers) > MAX_SERVERS:  # dicts keep order: the oldest first
                self._servers.pop(next(iter(self._servers))).close()
            return server

    def _drop(self, slot: int, module: str, server: WarmServer) -> None:
        with self._lock:
            if self._servers.get((slot, module)) is server:
                del self._servers[(slot, module)]
        server.close()

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()
