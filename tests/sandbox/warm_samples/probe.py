"""A sample's look at the interpreter it was given: what an earlier sample on the same slot
could have left there. Run where the sample's code runs (the grader's process in_process, the
policy's process under the boundary); `observe()` is called by the hidden test."""

import atexit
import builtins
import hashlib
import json
import os
import signal
import sys
import threading

# Built here, so that the source holds no copy of it.
TOKEN = "-".join(["trialbox", "warm", "leak", "f00d"]).encode()
SKIPPED = {signal.SIGKILL, signal.SIGSTOP}


def _digest(value):
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _mine(directory):
    """Entries of this uid in a place every sandbox may write (or its HOME)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return ["unreadable"]
    return sorted(
        name
        for name in names
        if os.lstat(os.path.join(directory, name)).st_uid == os.getuid()
        and not name.startswith(("solution", "tests", "__pycache__", ".pytest"))
    )


def _memory_hits():
    """How often TOKEN is in this process's writable memory."""
    hits = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw") or fields[-1] in ("[vvar]", "[vsyscall]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                hits += mem.read(end - start).count(TOKEN)
            except (OSError, ValueError, OverflowError):
                continue
    return hits


def _handler(number):
    handler = signal.getsignal(number)
    return getattr(handler, "__qualname__", str(handler))


def observe():
    env = sorted((k, v) for k, v in os.environ.items() if not k.startswith("TRIALBOX_"))
    return {
        "builtins": _digest(sorted(vars(builtins))),
        "module attribute": json.dumps([1]) + os.path.join("a", "b"),
        "sys.modules": _digest(
            sorted(
                (k, getattr(v, "__file__", None)) for k, v in sys.modules.items() if k != "solution"
            )
        ),
        "sys.path": _digest(sys.path),
        "meta_path": _digest([type(f).__qualname__ for f in sys.meta_path]),
        "path_importer_cache": _digest(sorted(sys.path_importer_cache)),
        "atexit": atexit._ncallbacks(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "tasks": len(os.listdir("/proc/self/task")),
        "signals": {int(n): _handler(n) for n in signal.valid_signals() if n not in SKIPPED},
        "environment": _digest(env),
        "cwd": os.getcwd(),
        "umask": os.umask(os.umask(0o022)),
        "/tmp": _mine("/tmp"),
        "/dev/shm": _mine("/dev/shm"),
        "HOME": _mine(os.environ["HOME"]),
        "memory": _memory_hits(),
    }


def add(a, b):
    return a + b
