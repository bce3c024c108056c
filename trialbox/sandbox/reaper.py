"""Every process a command starts is counted in the CPU time and peak memory it reports, on the
rlimit backend (no cgroup). wait4() of the command's main process only has what that process
waited for: work done in a child it never waits for, a double-forked daemon or a process killed
at the end would go uncounted.

So each command gets a reaper: a root process, not a slot uid (the sandbox cannot signal, trace
or read it), that makes itself a child subreaper (PR_SET_CHILD_SUBREAPER) and forks the
command. It is a program of its own (reaper_process.py), exec'd, never a fork of the worker:
the kernel keeps a process's largest resident set across exec, so a command forked from the
worker reported the worker's memory as its peak. Whatever the command's processes do, each ends
as a zombie of its parent or, once that parent is gone, of the reaper, which waits for every
one (__WALL: clone children too) until it has no child left. The kernel adds a reaped
process's CPU time, and that of everything it reaped, to its reaper's RUSAGE_CHILDREN, and its
largest resident set to the children's maxrss; so once the last process is gone the reaper's
RUSAGE_CHILDREN is the whole tree's, and it is only this command's (the worker's own is not: it
runs a job and a session at once). The reaper tells the worker when the main process exited
(its wait status), then, once every process is gone (the runner kills what is left), the
totals, on a pipe.

Not counted, as nowhere without privileges (taskstats and process accounting need
CAP_NET_ADMIN and CAP_SYS_PACCT): a child that exits while its parent has SIGCHLD ignored or
SA_NOCLDWAIT set is released by the kernel unreaped, and its time with it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trialbox.errors import SandboxError
from trialbox.sandbox import reaper_process, seccomp
from trialbox.sandbox.backend import Process
from trialbox.sandbox.reaper_process import EXITED, START, TOTALS

PROGRAM = Path(reaper_process.__file__)
# After the runner's kill, the reaper only has zombies left to reap.
TOTALS_WAIT_S = 5.0
# An interpreter's start, with room for a loaded machine.
START_WAIT_S = 30.0
# Below the worker's threads: the memory watchdog's samples must not wait behind the sandbox's
# own processes for a CPU (they would, six busy ones on two cores: 556 MiB held of 256 before a
# sample saw it). A sandbox cannot raise it back: RLIMIT_NICE 0.
SANDBOX_NICE = 10


@dataclass(frozen=True)
class Totals:
    cpu_s: float
    peak_mb: float  # the largest single process's resident set


class Reaped:
    """The worker's side: a command started under its reaper (`proc` is the reaper's Popen,
    its stdout and stderr the command's)."""

    def __init__(self, proc: Process, status: int) -> None:
        self.proc = proc
        self._status = status
        self._data = b""
        self._eof = False
        self.wait_status: int | None = None

    def _read(self, timeout: float | None) -> None:
        if self._eof or not select.select([self._status], [], [], timeout)[0]:
            return
        chunk = os.read(self._status, 64)
        self._eof = not chunk
        self._data += chunk
        if self.wait_status is None and len(self._data) >= EXITED.size:
            (self.wait_status,) = EXITED.unpack_from(self._data)
            self._data = self._data[EXITED.size :]

    def exited(self, within: float = 0.0) -> bool:
        """The main process has exited (its descendants may live on), or the reaper is gone
        without saying so: `wait` tells which, at once rather than at the deadline. Waits up to
        `within` seconds for the reaper to say so."""
        deadline = time.monotonic() + within
        if self.wait_status is None:
            self._read(0)
        while self.wait_status is None and not self._eof:
            left = deadline - time.monotonic()  # read once: select refuses a negative wait
            if left <= 0:
                break
            self._read(left)
        return self.wait_status is not None or self._eof

    def wait(self) -> int:
        """The main process's exit code (-N: killed by signal N)."""
        while self.wait_status is None and not self._eof:
            self._read(None)
        if self.wait_status is None:
            raise SandboxError(f"the command's reaper died: {self._reaper_end()}")
        return os.waitstatus_to_exitcode(self.wait_status)

    def totals(self) -> Totals:
        """Once every process of the command is gone (killed): the whole tree's CPU time and
        largest process. Reaps the reaper."""
        self.wait()
        deadline = time.monotonic() + TOTALS_WAIT_S
        while len(self._data) < TOTALS.size and not self._eof:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                break
            self._read(left)
        end = self._reaper_end()
        if len(self._data) < TOTALS.size:
            raise SandboxError(f"the command's reaper gave no totals: {end}")
        utime, stime, maxrss = TOTALS.unpack_from(self._data)
        return Totals(cpu_s=utime + stime, peak_mb=round(maxrss / 1024, 2))

    def _reaper_end(self) -> str:
        with contextlib.suppress(OSError):
            os.close(self._status)
        self._status = -1
        self._eof = True
        code = self.proc.wait()
        return f"it exited with {code}"

    def close(self) -> None:
        """The end of a command whose figures nobody reads (a companion), once it is killed."""
        if self._status >= 0:
            with contextlib.suppress(SandboxError):
                self.totals()


def filter_hex() -> str:
    """The seccomp filter the command's first process installs, as hex."""
    if platform.machine() not in seccomp.ARCHES:
        raise SandboxError(f"no seccomp filter for {platform.machine()}")
    return seccomp.program().hex()


def _read_exactly(read: int, size: int, proc: Process) -> bytes:
    """`size` bytes and never more: the records after them (the exit status, the totals) are
    `Reaped`'s to read, and they may be in the pipe already (a command that ended at once)."""
    told = b""
    while len(told) < size:
        ready = select.select([read], [], [], START_WAIT_S)[0]
        chunk = os.read(read, size - len(told)) if ready else b""
        if not chunk:
            proc.kill()
            code = proc.wait()
            raise SandboxError(f"the command's reaper did not start it (exited with {code})")
        told += chunk
    return told


def _read_start(read: int, proc: Process) -> None:
    """Until the reaper says the command exec'd (or why not): a SandboxError, never the
    command's failure, when it did not."""
    (length,) = START.unpack(_read_exactly(read, START.size, proc))
    if length:
        why = _read_exactly(read, length, proc).decode(errors="replace")
        proc.wait(timeout=TOTALS_WAIT_S)
        raise SandboxError(why)


def start(argv: list[str], uid: int, cwd: Path, env: dict[str, str], fds: list[int]) -> Reaped:
    """Start `argv` as `uid` under a reaper; its stdout and stderr are `proc`'s pipes."""
    read, write = os.pipe()
    try:
        command = [str(write), str(uid), str(SANDBOX_NICE), filter_hex(), "--", *argv]
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(PROGRAM), *command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[*fds, write],
            env=env,
            start_new_session=True,  # the reaper's own: out of the worker's process group
        )
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return attach(proc, read)


def attach(proc: Process, read: int) -> Reaped:
    """The command's reaper, once started with `read` the status pipe's end: a Reaped once the
    command started, else a SandboxError (the reaper killed and its pipes closed)."""
    try:
        _read_start(read, proc)
    except BaseException:
        os.close(read)
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise
    return Reaped(proc, read)
