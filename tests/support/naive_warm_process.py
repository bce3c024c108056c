"""A deliberately naive warm process, that tests/sandbox/test_warm.py runs in place of
trialbox/sandbox/warm_process.py to show that each of its attacks reaches the next sample when
nothing stops it: this one runs every command in its own interpreter (the slot uid as its real
and effective uid, root kept as the saved one to switch back to), then forgets the modules the
command imported and goes on. It changes to the slot's directory once, and sets each command's
variables over those it has. It speaks warm_process.py's protocol, and measures nothing."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import runpy
import socket
import sys

import reaper_process as reaper  # type: ignore[import-not-found]
import warm_process as warm  # type: ignore[import-not-found]

HIGH_FD = 900
_started: list[bool] = []


def _run_here(request: dict, received: list[int]) -> None:
    stdout, stderr, status, *passed = received
    saved = [os.dup(fd) for fd in (1, 2)]
    for fd, target in ((stdout, 1), (stderr, 2), *zip(passed, request["fds"], strict=True)):
        os.dup2(fd, target)
    if not _started:  # the slot's directory never changes: once is enough, it thinks
        os.chdir(request["cwd"])
        _started.append(True)
    os.environ.update(request["env"])  # every variable a command needs, it thinks
    before = set(sys.modules)
    uid = request["uid"]
    os.setresgid(uid, uid, 0)
    os.setresuid(uid, uid, 0)
    warm.libc.prctl(warm.PR_SET_DUMPABLE, 1, 0, 0, 0)
    os.write(status, reaper.START.pack(0))
    sys.argv = ["-m", *request["argv"][4:]]
    code = 0
    try:
        runpy._run_module_as_main(request["argv"][3])
    except SystemExit as exc:
        code = warm._exit_code(exc.code)
    except BaseException:
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.setresuid(0, 0, 0)
    os.setresgid(0, 0, 0)
    for name in set(sys.modules) - before:
        del sys.modules[name]
    os.write(status, reaper.EXITED.pack(code << 8))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    os.write(status, reaper.TOTALS.pack(0.0, 0.0, usage.ru_maxrss))
    for fd, target in zip(saved, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    for fd in received:
        with contextlib.suppress(OSError):  # the command may have closed it
            os.close(fd)


def main(args: list[str]) -> None:
    control = socket.socket(fileno=fcntl.fcntl(int(args[0]), fcntl.F_DUPFD, HIGH_FD))
    os.close(int(args[0]))
    warm.preload(args[1])
    control.sendall(warm.READY)
    while True:
        message, received, _, _ = socket.recv_fds(control, warm.MAX_REQUEST, warm.MAX_FDS)
        if not message:
            return
        stand_in = os.fork()  # the worker waits for "the reaper" to end: one that does at once
        if stand_in == 0:
            os._exit(0)
        control.sendall(stand_in.to_bytes(4, "little"))
        _run_here(json.loads(message), received)
