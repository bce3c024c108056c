"""The rlimit backend's reaper (trialbox/sandbox/reaper.py, reaper_process.py), red-teamed: what
the command inherits from it, and what the worker makes of a reaper that is gone."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from trialbox.errors import SandboxError
from trialbox.models import Limits
from trialbox.sandbox.runner import Runner

# `yes` killed by SIGPIPE says nothing; with SIGPIPE ignored it says "Broken pipe" and fails.
DISPOSITIONS = "grep SigIgn /proc/self/status; yes | head -n 1"


def test_the_command_starts_with_default_signal_dispositions(rlimit: Runner, bwrap: Runner) -> None:
    """Was a break of the exec'd reaper: it is a Python interpreter, which ignores SIGPIPE and
    SIGXFSZ, and it execs the command without restoring them (subprocess's restore_signals
    did, on the forked path), so every command ran with both ignored: a pipeline's writer
    got EPIPE and failed noisily instead of dying quietly, and a file past RLIMIT_FSIZE was
    EFBIG instead of SIGXFSZ. bwrap's commands start with neither ignored."""
    on_rlimit = rlimit.exec(["sh", "-c", DISPOSITIONS], Limits(timeout_s=10))
    on_bwrap = bwrap.exec(["sh", "-c", DISPOSITIONS], Limits(timeout_s=10))
    # Both inherit what the worker itself ignores (a test process may ignore others): only
    # the two the interpreter adds must not be.
    for result in (on_rlimit, on_bwrap):
        mask, _, rest = result.stdout.partition("\n")
        ignored = int(mask.removeprefix("SigIgn:\t"), 16)
        assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), result
        assert (rest, result.stderr, result.exit_code) == ("y\n", "", 0), result
    assert on_rlimit.stdout == on_bwrap.stdout


def _reaper_of(command: bytes) -> int | None:
    """The parent of the process running `command` (its cmdline), once it runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if cmdline.read() != command:
                    continue
            with open(f"/proc/{entry}/stat", "rb") as stat:
                return int(stat.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
    return None


def test_a_dead_reaper_is_a_sandbox_error_at_once_not_at_the_deadline(rlimit: Runner) -> None:
    """A reaper killed (the kernel's OOM killer, say) never reports the command's exit: the
    worker took it for a command still running and waited out the whole deadline (a
    session's command may have many minutes) before its sandbox_error."""
    killed: list[int] = []

    def kill_the_reaper() -> None:
        deadline = time.monotonic() + 10
        while not killed and time.monotonic() < deadline:
            reaper = _reaper_of(b"sleep\x002.345\x00")
            if reaper is not None:
                with open(f"/proc/{reaper}/cmdline", "rb") as cmdline:
                    assert b"reaper_process.py" in cmdline.read()
                os.kill(reaper, signal.SIGKILL)
                killed.append(reaper)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_reaper)
    killer.start()
    started = time.monotonic()
    with pytest.raises(SandboxError, match="reaper died"):
        rlimit.exec(["sleep", "2.345"], Limits(timeout_s=30))
    took = time.monotonic() - started
    killer.join()
    assert killed
    assert took < 10, took
