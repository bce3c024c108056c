"""A slot's warm process on the rlimit backend (the worker's side, and why: sandbox/warm.py).

The worker starts it as the sandbox runtime's `python -P`, with the environment a cold command
of its kind gets, as root, and it imports its module (pytest and its default plugins, or the
policy's zygote) once. Then, for each command the worker sends on the control socket (a JSON
request, and the command's descriptors by SCM_RIGHTS: stdout, stderr, the status pipe, then
those passed to it), it forks the command's reaper and answers its pid. The reaper is
reaper_process.py's, with one difference: the command's first process does not exec a new
interpreter; it becomes the slot uid exactly as a cold one does (session, priority, groups,
uid, the rlimits prlimit would set, no capabilities, no_new_privs, the seccomp filter), then
runs the module as `python -P -m MODULE ARGS` would, in the interpreter it inherited, and exits
as that interpreter would.

This process never runs a sample's code, nor holds anything of one: a sample's process is a
fork, and whatever it changes (modules, builtins, sys.path, atexit hooks, threads, signal
handlers, the environment, the working directory, memory) dies with it. It runs as root, so
no slot uid can signal, trace or read it. Standard library only, as reaper_process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import os
import resource
import runpy
import signal
import socket
import sys
import types
from collections.abc import Callable
from typing import Any

import reaper_process as reaper  # type: ignore[import-not-found]  # beside this file

MAX_REQUEST = 1 << 20
MAX_FDS = 64
READY = b"ready"
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
PR_SET_DUMPABLE = 4
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x20000000, 0x40000000, 0x10000000
PR_CAPBSET_DROP = 24
libc = ctypes.CDLL(None, use_errno=True)


def preload(module: str) -> None:
    """What every command of this kind imports first; pytest's default plugins with pytest."""
    importlib.import_module(module)
    if module == "pytest":
        from _pytest.config import default_plugins

        for name in default_plugins:
            try:
                importlib.import_module(f"_pytest.{name}")
            except ImportError:
                continue


def _drop_capabilities() -> None:
    """setpriv's --inh-caps=-all: the uid switch cleared the effective and permitted sets; the
    inheritable set (and with it the ambient) goes too."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.syscall(SYS_CAPSET[os.uname().machine], header, data) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"capset: {os.strerror(code)}")


def _exit_code(code: object) -> int:
    """The interpreter's own rule for SystemExit's code (one past a C long is an error: 255)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(2**63) <= code < 2**63 else 255
    with contextlib.suppress(Exception):  # the interpreter too ignores a text it cannot print
        print(code, file=sys.stderr)
    return 1


def _run_as_main(module: str) -> int:
    """`python -m module`'s run and exit: SystemExit's code, the excepthook for anything else
    (a KeyboardInterrupt ends by SIGINT, as the interpreter does), non-daemon threads joined,
    atexit hooks run, stdio flushed."""
    interrupted = False
    try:
        runpy._run_module_as_main(module)  # type: ignore[attr-defined]  # what -m runs
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    threading = sys.modules.get("threading")  # never imported: no thread to join
    if threading is not None:
        with contextlib.suppress(BaseException):  # as the interpreter's own shutdown does
            threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120  # the interpreter's exit when its last flush fails
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _runner(
    module: str, argv: list[str], rlimits: list[list[int]]
) -> Callable[[Callable[[], None]], None]:
    """What the command's first process does once it is the slot uid under the filter."""

    def run(started: Callable[[], None]) -> None:
        for kind, value in rlimits:
            resource.setrlimit(kind, (value, value))
        _drop_capabilities()
        # The uid switch made this process undumpable (an exec would have undone it): its /proc
        # files would be root's, and the watchdog, which finds a sandbox's processes by their
        # owner there, would not see it. Its memory is the sample's own, as after a cold exec.
        if libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
        for name in ("warm_process", "reaper_process"):
            sys.modules.pop(name, None)
        # What the reaper's request left freed goes back, not into this process's resident
        # memory (each fork the command makes would hold it too).
        libc.malloc_trim(0)
        tempfile = sys.modules.get("tempfile")
        if tempfile is not None:  # found again from this environment's TMPDIR
            setattr(tempfile, "tempdir", None)  # noqa: B010
        entry = sys.modules.get(module)
        if entry is not None and not hasattr(entry, "__path__"):
            del sys.modules[module]  # a plain module runs as __main__ only, as under -m
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        sys.argv = ["-m", *argv[4:]]
        sys.orig_argv = list(argv)
        started()
        os._exit(_run_as_main(module))

    return run


def _place(received: list[int], targets: list[int]) -> tuple[int, list[int]]:
    """The command's descriptors where it expects them: stdin /dev/null, stdout, stderr, and
    each passed one at the number its variable names; every other one closed. The status
    pipe's number and those of the descriptors after the passed ones (`_enter`'s), above them
    all."""
    floor = max([2, *targets]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in received]
    for fd in received:
        os.close(fd)
    stdout, stderr, status, *rest = moved
    passed, extra = rest[: len(targets)], rest[len(targets) :]
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (stdout, 1), (stderr, 2), *zip(passed, targets, strict=True)):
        os.dup2(fd, target)
    keep = {0, 1, 2, status, *targets, *extra}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.close(int(name))
    return status, extra


def _setns(fd: int, kinds: int) -> None:
    if libc.setns(fd, kinds) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def _enter(
    holder: int, cgroups: list[int], cwd: str
) -> tuple[Callable[[], None], Callable[[], None]]:
    """bwrap: what the command's first process does to be where a cold command is. Still root:
    it joins the sandbox's cgroup (writing its own pid, 0, to each hierarchy's procs file the
    worker opened) and the holder's namespaces but its user namespace (`holder`: a pidfd), and
    starts in its working directory there (the reaper entered its pid namespace before the
    fork). Once it is the uid: it joins the holder's user namespace too, as bwrap's command is
    in it (outside it, as the uid that owns it, it would hold every capability over the
    sandbox's mounts), and drops the bounding set, as bwrap does."""

    def enter() -> None:
        for fd in cgroups:
            os.write(fd, b"0")
            os.close(fd)
        _setns(holder, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
        os.chdir(cwd)

    def switched() -> None:
        _setns(holder, CLONE_NEWUSER)
        os.close(holder)
        with open("/proc/sys/kernel/cap_last_cap") as cap_last_cap:
            last = int(cap_last_cap.read())
        for capability in range(last + 1):
            if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability})")

    return enter, switched


def _reaper(request: dict[str, Any], received: list[int]) -> None:
    """The forked reaper: the command's descriptors, working directory and environment, then
    reaper_process's start and reap."""
    status, extra = _place(received, request["fds"])
    os.setsid()
    enter = switched = None
    holder = -1
    if extra:  # bwrap: a sandbox to enter; its pid namespace now, for the fork
        holder, *cgroups = extra
        _setns(holder, CLONE_NEWPID)
        enter, switched = _enter(holder, cgroups, request["cwd"])
    else:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    run = _runner(argv[3], argv, request["rlimits"])
    program = bytes.fromhex(request["filter"])
    try:
        uid, nice = request["uid"], request["nice"]
        first = reaper._start(status, uid, nice, program, argv, run, enter, switched)
    except OSError as exc:  # before any fork: the command never started
        why = reaper._why(exc)
        os.write(status, reaper.START.pack(len(why)) + why)
        return
    reaper.reap(status, first, holder)


def _collect() -> None:
    """Reap the reapers that ended (each is this process's child until then)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


CALIBRATION_TEST = "def test_calibration():\n    assert sum([1, 2]) == 3\n"


def _still_shared_kib(module: str) -> int:
    """What a command forked from here still shares with this process once it ran: its
    anonymous pages less those it wrote (copied on write) or made. Measured on a fork that
    runs pytest on one test (a pytest command copies much of what pytest's import made; the
    policy's zygote, which forks a server per request, little). The backend charges each
    command that much more than its cgroup sees (bwrap_warm.py)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            if module == "pytest":
                _calibrate_pytest()
            with open("/proc/self/smaps_rollup") as rollup:
                fields = dict(line.split(":", 1) for line in rollup if ":" in line)
            anonymous = int(fields["Anonymous"].split()[0])
            written = int(fields["Private_Dirty"].split()[0])
            os.write(write, str(max(anonymous - written, 0)).encode())
        finally:
            os._exit(0)
    os.close(write)
    told = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    return int(told) if told.isdigit() else 0


def _calibrate_pytest() -> None:
    import tempfile

    import pytest

    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "test_calibration.py"), "w") as test:
            test.write(CALIBRATION_TEST)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        args = ["-q", "-p", "no:cacheprovider", "-c", os.devnull, f"--rootdir={root}", root]
        pytest.main([*args, f"--confcutdir={root}"])


def main(args: list[str]) -> None:
    control = socket.socket(fileno=int(args[0]))
    preload(args[1])
    gc.freeze()  # what every fork shares stays shared: the collector never writes to it
    control.sendall(READY + b" " + str(_still_shared_kib(args[1])).encode())
    while True:
        _collect()
        try:
            message, received, _, _ = socket.recv_fds(control, MAX_REQUEST, MAX_FDS)
        except OSError:
            return
        if not message:
            return  # the worker is gone
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                _reaper(json.loads(message), received)
            finally:
                os._exit(0)
        for fd in received:
            os.close(fd)
        control.sendall(pid.to_bytes(4, "little"))
