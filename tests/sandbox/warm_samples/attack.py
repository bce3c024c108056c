"""A sample that leaves something in each place of the interpreter it was given, and around
it, for the next sample on the same slot to find (probe.py looks; each attack is named after
the probe's key for where it looks), and stops or kills every ancestor it may signal: the
warm process it was forked from among them, if it could."""

import atexit
import builtins
import contextlib
import json
import os
import signal
import sys
import threading
import time
import types

PLANT = None  # the names of the attacks to make (the test sets them), or None: every one
TOKEN = "-".join(["trialbox", "warm", "leak", "f00d"]).encode()
KEPT = []


class PlantedFinder:
    def find_spec(self, *args, **kwargs):
        return None


def _module_attribute():
    json.dumps = lambda *args, **kwargs: "planted"
    os.path.join = lambda *parts: "planted"


def _signals():
    signal.signal(signal.SIGUSR1, lambda *args: None)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _file(place):
    try:
        with open(f"{place}/trialbox-planted", "w") as planted:
            planted.write("planted")
    except OSError:
        pass


def _cwd():
    with contextlib.suppress(OSError):
        os.chdir("/tmp")


def _ancestors():
    pid = os.getppid()
    while pid > 1:
        yield pid
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                pid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            return


def _signal_ancestors():
    for ancestor in list(_ancestors()):
        for number in (signal.SIGSTOP, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(ancestor, number)


ATTACKS = {
    "builtins": lambda: setattr(builtins, "trialbox_planted", True),
    "module attribute": _module_attribute,
    # A module every run imports replaced, and one added.
    "sys.modules": lambda: sys.modules.update(
        gettext=types.ModuleType("gettext"), trialbox_planted=types.ModuleType("planted")
    ),
    "sys.path": lambda: sys.path.insert(0, "/planted"),
    "meta_path": lambda: sys.meta_path.insert(0, PlantedFinder()),
    "path_importer_cache": lambda: sys.path_importer_cache.setdefault("/planted/cache", None),
    "atexit": lambda: atexit.register(print, "planted"),
    "threads": lambda: threading.Thread(
        target=time.sleep, args=(3600,), name="planted", daemon=True
    ).start(),
    "signals": _signals,
    "environment": lambda: os.environ.__setitem__("PLANTED", "1"),
    "cwd": _cwd,
    "umask": lambda: os.umask(0o000),
    # Memory a later fork could read, were it shared.
    "memory": lambda: KEPT.append(bytearray(TOKEN * 4096)),
    "/tmp": lambda: _file("/tmp"),
    "/dev/shm": lambda: _file("/dev/shm"),
    "HOME": lambda: _file(os.environ["HOME"]),
    "ancestors": _signal_ancestors,
}
for name, plant in ATTACKS.items():
    if PLANT is None or name in PLANT:
        plant()


def add(a, b):
    return a + b
