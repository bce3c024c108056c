"""The reaper's own program (the worker's side, and why a reaper: trialbox/sandbox/reaper.py).

The worker execs it as `python -I -S reaper_process.py STATUS_FD UID NICE FILTER -- COMMAND...`
and never forks it from itself: the kernel keeps a process's largest resident set across exec,
so a command forked from the worker's memory reported the worker's (531 MiB for an honest
program of 340) as its peak. Started fresh, the reaper and the command's first process hold
only this small interpreter before the command's exec. So it imports the standard library only.

It makes itself a child subreaper and forks the command's first process, which starts a new
session below the worker's priority (NICE), drops its groups, switches to UID, installs the
seccomp FILTER (hex of `struct sock_filter`s, trialbox/sandbox/seccomp.py) under no_new_privs and
execs COMMAND. The reaper then waits for every descendant, and writes on STATUS_FD:
1. START: the length of why the command could not start, then that text (0: it started);
2. EXITED: the first process's wait status;
3. TOTALS: RUSAGE_CHILDREN's utime and stime (s) and maxrss (KiB), once no child is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import struct
import sys
from collections.abc import Callable

START = struct.Struct("=I")
EXITED = struct.Struct("=i")
TOTALS = struct.Struct("=ddq")
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
PR_SET_CHILD_SUBREAPER = 36
WALL = 0x40000000  # __WALL: children whatever their exit signal (clone children too)
MAX_WHY = 4096


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(libc: ctypes.CDLL, option: int, arg2: int, arg3: object = 0) -> None:
    if libc.prctl(option, arg2, arg3, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}): {os.strerror(code)}")


def _become(
    uid: int,
    nice: int,
    program: bytes,
    libc: ctypes.CDLL,
    execs: bool = True,
    switched: Callable[[], None] | None = None,
) -> None:
    """In the command's first process, before its exec (`execs`) or before it runs a module
    in this interpreter (warm_process.py). `switched`: what it does once it is the uid, before
    no_new_privs and the filter (join the sandbox's user namespace)."""
    if execs:
        # What this interpreter ignores at its start, an exec would hand on: the command would
        # get EPIPE for SIGPIPE and EFBIG for SIGXFSZ (subprocess's restore_signals, as
        # bwrap's). A module run in this interpreter keeps them ignored, as its own start does.
        for number in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
    os.setsid()
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if switched is not None:
        switched()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    _prctl(libc, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog))


def _which(name: str) -> str:
    """`name` on the environment's PATH (it is the command's first program, never the
    sandbox's: prlimit)."""
    if "/" in name:
        return name
    for place in os.get_exec_path():
        path = os.path.join(place, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    raise FileNotFoundError(f"{name} is not on PATH")


def _start(
    status: int,
    uid: int,
    nice: int,
    program: bytes,
    argv: list[str],
    run: Callable[[Callable[[], None]], None] | None = None,
    enter: Callable[[], None] | None = None,
    switched: Callable[[], None] | None = None,
) -> int:
    """Fork the command's first process; its pid, once it exec'd (START written either way).
    `run`: instead of the exec, the command is a module this interpreter runs (warm_process.py);
    it is handed what tells the reaper the command started, once it has. `enter`: what the
    first process does as root before it becomes the uid (join a sandbox's namespaces);
    `switched`: what it does once it is (join the sandbox's user namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    # Found as root, before the switch: the uid may not read the modules a lookup imports.
    path = _which(argv[0]) if run is None else ""
    why_read, why_write = os.pipe2(os.O_CLOEXEC)
    main = os.fork()
    if main == 0:
        try:
            os.close(status)
            os.close(why_read)
            if enter is not None:
                enter()
            _become(uid, nice, program, libc, execs=run is None, switched=switched)
            if run is None:
                os.execv(path, argv)
            run(lambda: os.close(why_write))
        except BaseException as exc:  # every failure is told, then the exit
            os.write(why_write, _why(exc))
        finally:
            os._exit(127)
    os.close(why_write)
    why = b""
    while chunk := os.read(why_read, MAX_WHY):  # EOF at the exec (close-on-exec) or the exit
        why += chunk
    os.close(why_read)
    os.write(status, START.pack(len(why)) + why)
    return main


def _why(exc: BaseException) -> bytes:
    return f"{type(exc).__name__}: {exc}".encode()[:MAX_WHY]


def reap(status: int, first: int, holder: int = -1) -> None:
    """Once the command started: wait for every process of it, and tell its end on `status`.
    `holder` (a warm command on bwrap: a pidfd of its sandbox's pid 1): killed once the first
    process exited, which ends every process in the sandbox, as bwrap's init does when its
    command exits."""
    # Only the command's processes may hold its pipes (and the descriptors passed to it) open.
    keep = sorted({status, holder} - {-1})
    low = 0
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    while True:
        try:
            pid, wait_status, _ = os.wait4(-1, WALL)
        except ChildProcessError:
            break
        if pid == first:
            os.write(status, EXITED.pack(wait_status))
            if holder >= 0:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(holder, signal.SIGKILL)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.write(status, TOTALS.pack(usage.ru_utime, usage.ru_stime, usage.ru_maxrss))


def main(args: list[str]) -> None:
    status, uid, nice, program = int(args[0]), int(args[1]), int(args[2]), bytes.fromhex(args[3])
    try:
        first = _start(status, uid, nice, program, args[5:])
    except OSError as exc:  # before any fork: the command never started
        why = _why(exc)
        os.write(status, START.pack(len(why)) + why)
        return
    reap(status, first)


if __name__ == "__main__":
    main(sys.argv[1:])
