"""The interface both isolation backends implement, and the supervision loop they share:
selector-based capped output, a wall deadline, and whole-tree kill.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, Protocol

from trialbox.errors import SandboxError, Stopped
from trialbox.models.limits import Limits
from trialbox.sandbox import processes
from trialbox.sandbox.output import Collector, HeadTail
from trialbox.sandbox.runtime import Runtime
from trialbox.sandbox.slots import Slot

if TYPE_CHECKING:
    from trialbox.sandbox.warm import WarmPool

# After the main process exits, a descendant may still hold the pipes; it is killed, and what
# it had written is drained for at most this long.
DRAIN_S = 0.5
REPORT_CAP = 16 * 1024 * 1024
KILLED_EXIT = 128 + signal.SIGKILL
REPORT_FD_ENV = "TRIALBOX_REPORT_FD"


class Process(Protocol):
    """What a backend needs of the process it started (a Popen, or a warm reaper)."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def kill(self) -> None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass(frozen=True, kw_only=True)
class CommandSpec:
    argv: tuple[str, ...]
    workdir: Path  # host path; the command's working directory
    role: Literal["agent", "grader"]
    limits: Limits
    timeout_s: float
    env: dict[str, str]  # the complete environment inside the sandbox
    report: bool = False  # open a pipe for the trusted plugin (grading only)
    # (variable, data): the data on an inherited descriptor whose number the variable names,
    # never in a file, the environment or argv (io_match's hidden cases).
    channel: tuple[str, bytes] | None = None
    # (variable, descriptor): inherited by the command, whose number the variable names. The
    # run owns them from then on and closes its copies once the command started.
    inherit: tuple[tuple[str, int], ...] = ()
    # Started in the same slot once this command runs (under bwrap, in its cgroup: one memory
    # limit for both) and killed with it: the policy's process at grading.
    companion: CommandSpec | None = None


@dataclass
class Measured:
    """What the backend measured itself once the process tree was gone."""

    exit_code: int | None
    cpu_s: float
    peak_memory_mb: float
    oom_killed: bool
    started: bool = True  # False: the sandbox never got to exec the command
    error: str | None = None


@dataclass
class Outcome:
    exit_code: int | None
    signal: str | None
    timed_out: bool
    oom_killed: bool
    wall_s: float
    cpu_s: float
    peak_memory_mb: float
    stdout: HeadTail
    stderr: HeadTail
    report: bytes = b""
    report_overflowed: bool = False
    extra: dict[str, str] = field(default_factory=dict)


class Launched(ABC):
    """A started sandbox. The backend owns its process tree and its measurements."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc

    @abstractmethod
    def kill_tree(self) -> None:
        """SIGKILL every process the command started, wherever it went."""

    def exited(self, within: float = 0.0) -> bool:
        """The main process has exited (a backend may keep it unreaped until `wait`), waiting
        up to `within` seconds for it (woken by the exit, not by polling)."""
        if self.proc.poll() is None and within > 0:
            with contextlib.suppress(OSError):  # it is reaped already: poll says so
                pidfd = os.pidfd_open(self.proc.pid)
                try:
                    select.select([pidfd], [], [], within)
                finally:
                    os.close(pidfd)
        return self.proc.poll() is not None

    def wait(self) -> int:
        return self.proc.wait()

    def discard(self) -> None:
        """A companion's end: killed and reaped, its pipes closed, nothing measured."""
        self.kill_tree()
        self.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    @abstractmethod
    def finish(self, returncode: int) -> Measured:
        """Called once after exit and kill: measure, then release per-command resources."""


class Backend(ABC):
    name: Literal["bwrap", "rlimit"]
    caps_workspace: bool  # prepare_dir enforces size_mb itself (ENOSPC past it)
    runtime: Runtime
    warm: WarmPool | None  # the slots' warm processes (warm.py), None when they are off

    def warm_module(self, spec: CommandSpec) -> str | None:
        """The module a warm process would run this command as; None: it starts cold."""
        from trialbox.sandbox.warm import warm_module  # warm imports this module

        if self.warm is None:
            return None
        return warm_module(spec.argv, spec.env, self.runtime.python)

    def warm_up(self, slot: Slot, spec: CommandSpec) -> None:
        """Before the command's clock starts: the slot's warm process for it, started if it
        has none (an interpreter's start and pytest's import are not the sample's time)."""
        module = self.warm_module(spec)
        if self.warm is not None and module is not None:
            self.warm.ready(slot.index, module, spec.env)

    @abstractmethod
    def prepare_dir(
        self, path: Path, size_mb: int, owner: int, group: int, mode: int, inodes: int = 65536
    ) -> None:
        """Make `path` an empty directory with this owner, capped at size_mb (and `inodes`
        files) where the backend can."""

    @abstractmethod
    def release_dir(self, path: Path) -> None: ...

    @abstractmethod
    def launch(self, slot: Slot, spec: CommandSpec, fds: list[int], join: bool = False) -> Launched:
        """Start the command; `fds` are inherited by it (the report pipe, the channel). `join`:
        a companion of the slot's running command, sharing its per-command resources."""

    @abstractmethod
    def sweep(self, slot: Slot) -> None:
        """Remove everything a previous holder of the slot may have left (it may have died)."""

    def sweep_many(self, slots: list[Slot]) -> None:
        """`sweep` each of them (a backend may do it in one pass)."""
        for slot in slots:
            self.sweep(slot)

    @abstractmethod
    def release(self, slot: Slot) -> None:
        """Clean up after a holder that finished normally; may be cheaper than `sweep`."""

    def accounting(self, slot: Slot, limits: Limits) -> tuple[Path, ...]:
        """The cgroup procs files a helper the worker starts as root (a session's checkpoint
        builder) writes itself into, to be in the slot's resource accounting under `limits`.
        () where the backend has none to join (rlimit: the helper's rusage is its account)."""
        return ()

    def residue(self, uids: tuple[int, ...]) -> list[str]:
        """What the uids still have where a later job could see it; [] when clean. A bwrap
        sandbox's namespaces and tmpfs die with it, so only its processes could remain."""
        return [f"process {pid}" for pid in processes.processes_of(uids)]

    def run(self, slot: Slot, spec: CommandSpec) -> Outcome:
        """The command, supervised to its end, its deadline, or the slot's `stop`: then it is
        killed and Stopped raised (a stopped run has no outcome to score)."""
        report = Collector(REPORT_CAP)
        read_fd, write_fd = os.pipe() if spec.report else (None, None)
        passed: list[int] = []
        named: dict[str, str] = {}  # each passed descriptor's variable, and its number
        if write_fd is not None:
            named[REPORT_FD_ENV] = str(write_fd)
            passed.append(write_fd)
        if spec.channel is not None:
            variable, data = spec.channel
            channel = os.memfd_create("trialbox-channel")
            passed.append(channel)
            view = memoryview(data)
            while view:
                view = view[os.write(channel, view) :]
            os.lseek(channel, 0, os.SEEK_SET)
            named[variable] = str(channel)
        for variable, fd in spec.inherit:
            named[variable] = str(fd)
            passed.append(fd)
        spec = replace(spec, env=spec.env | named)
        later = [fd for _, fd in spec.companion.inherit] if spec.companion else []
        for command in (spec, spec.companion):
            if command is not None:
                self.warm_up(slot, command)
        started = time.monotonic()
        companion: Launched | None = None
        try:
            if slot.stop.is_set():
                raise Stopped("the run was stopped before this command started")
            launched = self.launch(slot, spec, passed)
            if spec.companion is not None:
                companion = self._companion(slot, spec.companion, launched)
        except BaseException:
            if read_fd is not None:  # nothing started that would read it
                os.close(read_fd)
            raise
        finally:
            for fd in passed + later:
                os.close(fd)
        try:
            outcome = self._supervise(spec, launched, companion, started, read_fd, report, slot)
        finally:
            if companion is not None:
                companion.discard()
        if slot.stop.is_set():
            raise Stopped("the run was stopped while this command ran")
        return outcome

    def _companion(self, slot: Slot, spec: CommandSpec, main: Launched) -> Launched:
        spec = replace(spec, env=spec.env | {variable: str(fd) for variable, fd in spec.inherit})
        try:
            return self.launch(slot, spec, [fd for _, fd in spec.inherit], join=True)
        except BaseException:
            main.kill_tree()
            main.wait()
            raise

    def _supervise(
        self,
        spec: CommandSpec,
        launched: Launched,
        companion: Launched | None,
        started: float,
        read_fd: int | None,
        report: Collector,
        slot: Slot,
    ) -> Outcome:
        stdout, stderr = HeadTail(spec.limits.output_bytes), HeadTail(spec.limits.output_bytes)
        proc = launched.proc
        assert proc.stdout is not None and proc.stderr is not None
        sinks: dict[int, HeadTail | Collector] = {
            proc.stdout.fileno(): stdout,
            proc.stderr.fileno(): stderr,
        }
        if read_fd is not None:
            sinks[read_fd] = report
        timed_out = False
        deadline = started + spec.timeout_s
        with selectors.DefaultSelector() as selector:
            for fd in sinks:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if launched.exited():
                    # The main process is gone: whatever still holds a pipe is a leftover.
                    launched.kill_tree()
                    deadline = min(deadline, now + DRAIN_S)
                if slot.stop.is_set():
                    launched.kill_tree()
                    break
                if now >= deadline:
                    if not launched.exited():
                        timed_out = True
                    launched.kill_tree()
                    break
                for key, _ in selector.select(timeout=min(deadline - now, 0.05)):
                    fd = int(key.fd)
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        sinks[fd].feed(chunk)
                    else:
                        selector.unregister(fd)
        # Every pipe closed (a command may close its stdout and stderr and run on): the
        # deadline still holds while the main process lives.
        while not timed_out and not launched.exited():
            now = time.monotonic()
            if slot.stop.is_set():
                launched.kill_tree()
                break
            if now >= deadline:
                timed_out = True
                launched.kill_tree()
                break
            launched.exited(min(deadline - now, 0.05))
        returncode = launched.wait()
        wall_s = time.monotonic() - started
        launched.kill_tree()
        if companion is not None:
            companion.discard()
        measured = launched.finish(returncode)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        if read_fd is not None:
            with contextlib.suppress(OSError):
                os.close(read_fd)
        # Killed at its deadline before the command started (a deadline shorter than the
        # sandbox's start-up): the command's timeout, never a sandbox failure with a loss mask.
        if not measured.started and not timed_out:
            raise SandboxError(measured.error or "the sandbox failed to start the command")
        # The runner's own kills (deadline, OOM) are known to be SIGKILL. Any other signal death
        # shows as 128+N under bwrap, and its name stays unknown.
        oom_killed = measured.oom_killed and not timed_out
        killed = timed_out or (oom_killed and measured.exit_code in (None, KILLED_EXIT))
        return Outcome(
            exit_code=None if killed else measured.exit_code,
            signal=signal.Signals.SIGKILL.name if killed else None,
            timed_out=timed_out,
            oom_killed=oom_killed,
            wall_s=round(wall_s, 4),
            cpu_s=round(measured.cpu_s, 4),
            peak_memory_mb=measured.peak_memory_mb,
            stdout=stdout,
            stderr=stderr,
            report=bytes(report.data),
            report_overflowed=report.overflowed,
        )
