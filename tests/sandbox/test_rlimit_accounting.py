"""The CPU and peak memory a command reports on the rlimit backend are all of its processes',
whatever they did: children never waited for, double forks into a new session, many
short-lived children, threads of an orphan, processes killed at the end. bwrap's cgroup counts
them all; rlimit's figure must agree with it (trialbox/sandbox/reaper.py)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from trialbox.models import Limits, Status
from trialbox.sandbox import reaper
from trialbox.sandbox.runner import Runner

# Burns about `seconds` of CPU in this thread, whatever the interpreter's speed.
BURN = (
    "import os, time\n"
    "def burn(seconds):\n"
    "    end = time.thread_time() + seconds\n"
    "    while time.thread_time() < end:\n"
    "        pass\n"
)
# The work in a forked child that is never waited for (the red team's offload).
UNWAITED_CHILD = BURN + (
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    burn(0.6); os.write(w, b'done'); os._exit(0)\n"
    "os.close(w)\n"
    "print(os.read(r, 4).decode())\n"
)
# A daemon: fork, setsid, fork again; the middle process exits at once and is waited for.
DOUBLE_FORK_SETSID = BURN + (
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        burn(0.6); os.write(w, b'done'); os._exit(0)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "os.close(w)\n"
    "print(os.read(r, 4).decode())\n"
)
# 60 children of 10 ms each, most over before a sampler could see them, none waited for.
SHORT_LIVED = BURN + (
    "r, w = os.pipe()\n"
    "for _ in range(60):\n"
    "    if os.fork() == 0:\n"
    "        burn(0.01); os.write(w, b'.'); os._exit(0)\n"
    "os.close(w)\n"
    "got = b''\n"
    "while chunk := os.read(r, 64):\n"
    "    got += chunk\n"
    "print('done' if len(got) == 60 else len(got))\n"
)
# Two threads burning in an orphan whose parent exited first.
THREADS_OF_AN_ORPHAN = BURN + (
    "import threading\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    if os.fork() == 0:\n"
    "        threads = [threading.Thread(target=burn, args=(0.3,)) for _ in range(2)]\n"
    "        [t.start() for t in threads]; [t.join() for t in threads]\n"
    "        os.write(w, b'done'); os._exit(0)\n"
    "    os._exit(0)\n"
    "os.close(w)\n"
    "print(os.read(r, 4).decode())\n"
)
PROGRAMS = {
    "unwaited_child": UNWAITED_CHILD,
    "double_fork_setsid": DOUBLE_FORK_SETSID,
    "short_lived_children": SHORT_LIVED,
    "threads_of_an_orphan": THREADS_OF_AN_ORPHAN,
}
# A child that burns 0.6 s of CPU, says so, and burns on until the sandbox kills it once the
# main process exited.
KILLED_AT_THE_END = BURN + (
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    burn(0.6); os.write(w, b'done')\n"
    "    while True:\n"
    "        pass\n"
    "os.close(w)\n"
    "print(os.read(r, 4).decode())\n"
)
# A child that holds 300 MiB and is never waited for; the main process holds little.
BIG_UNWAITED_CHILD = (
    "import os, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    block = bytearray(300 * 1024 * 1024)\n"
    "    os.write(w, b'done'); os._exit(0)\n"
    "os.close(w)\n"
    "print(os.read(r, 4).decode())\n"
)


def cpu_s(runner: Runner, code: str) -> float:
    result = runner.exec(["python", "-c", code], Limits(timeout_s=20))
    assert (result.exit_code, result.stdout) == (0, "done\n"), result.stderr
    return result.cpu_s


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cpu_of_every_process_is_counted(rlimit: Runner, bwrap: Runner, name: str) -> None:
    on_rlimit, on_bwrap = cpu_s(rlimit, PROGRAMS[name]), cpu_s(bwrap, PROGRAMS[name])
    assert on_rlimit >= 0.55, (on_rlimit, on_bwrap)
    assert abs(on_rlimit - on_bwrap) <= 0.2 * on_bwrap, (on_rlimit, on_bwrap)


def test_cpu_of_a_process_killed_at_the_end_is_counted(rlimit: Runner) -> None:
    assert cpu_s(rlimit, KILLED_AT_THE_END) >= 0.6


def test_peak_memory_of_an_unwaited_child_is_counted(rlimit: Runner) -> None:
    result = rlimit.exec(["python", "-c", BIG_UNWAITED_CHILD], Limits(memory_mb=1024))
    assert (result.exit_code, result.stdout) == (0, "done\n"), result.stderr
    assert result.peak_memory_mb >= 300, result.peak_memory_mb


def test_the_workers_own_memory_is_not_the_commands_peak(rlimit: Runner, bwrap: Runner) -> None:
    """Was a break: the command was forked from the worker (its reaper, then itself), and the
    kernel keeps a process's largest resident set across exec, so every command's peak was at
    least the worker's: an honest program of 340 MiB reported 531 MiB in a suite's worker of
    that size, and the performance scorer compared solutions by the worker's memory, not
    theirs. A command's peak is what its own processes held, as bwrap's cgroup reports it."""
    ballast = bytearray(os.urandom(1024)) * (400 * 1024)  # 400 MiB resident in this process
    small = "print('done')"
    result = rlimit.exec(["python", "-c", small], Limits(memory_mb=1024))
    on_bwrap = bwrap.exec(["python", "-c", small], Limits(memory_mb=1024))
    assert len(ballast) and (result.exit_code, result.stdout) == (0, "done\n"), result.stderr
    assert result.peak_memory_mb < 64, (result.peak_memory_mb, on_bwrap.peak_memory_mb)
    assert abs(result.peak_memory_mb - on_bwrap.peak_memory_mb) <= 16


def test_a_command_over_before_the_worker_reads_its_start_is_still_measured(
    rlimit: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break of the exec'd reaper: the worker read the reaper's start record with the
    records after it (the exit status, the totals) when the command ended first, dropped them,
    and took the reaper for dead: `sandbox_error` for a quick command on a busy machine (a
    session's `cat` after a reopen). Here the worker reads the record late, always."""
    real = reaper.select.select

    def late(*args: Any) -> Any:
        time.sleep(0.3)  # the command (`true`) and its reaper are done by then
        return real(*args)

    monkeypatch.setattr(reaper.select, "select", late)
    result = rlimit.exec(["true"], Limits(timeout_s=10))
    assert (result.status, result.exit_code) == (Status.SUCCEEDED, 0), result
