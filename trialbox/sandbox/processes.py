"""Every process of the slot uids, and killing them from root, from outside (CAP_KILL): a slot
uid cannot signal root, so nothing it left can stop or outrun the kill. Every process of the
uids is stopped (SIGSTOP) until none runs, so a fork bomb cannot grow the set, and then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from trialbox.errors import SandboxError

WAIT_GONE_S = 5.0
DEAD = (b"Z", b"X")
STOPPED = (b"T", b"t")


def _task_states(pid: int) -> list[bytes] | None:
    """The state letter of each task (thread) of a thread group; None once it is gone. Its
    leader may have exited (Z) while its other threads run on, which the leader's own state
    would hide."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    states = []
    for tid in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
            states.append(stat.read().rsplit(b")", 1)[1].split()[0])
    return states


def processes_of(uids: tuple[int, ...]) -> list[int]:
    """Live pids (thread groups) owned by one of `uids`. A group whose every task is dead is
    skipped: its reaping is up to its parent (the container's init, or bwrap's)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.stat(entry.path).st_uid in uids:
                states = _task_states(int(entry.name)) or []
                if any(state not in DEAD for state in states):
                    found.append(int(entry.name))
    return found


def _stopped(pid: int) -> bool:
    states = _task_states(pid)
    return states is None or all(state in STOPPED + DEAD for state in states)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            raise SandboxError(f"cannot signal slot processes ({exc}): is CAP_KILL kept?") from exc


def kill_all(uids: tuple[int, ...]) -> None:
    """Stop every process of the uids until none runs (a stopped process cannot fork), then
    SIGKILL them all and wait until they are gone."""
    deadline = time.monotonic() + WAIT_GONE_S
    pids = processes_of(uids)
    while pids:
        _signal(pids, signal.SIGSTOP)
        now = processes_of(uids)
        if set(now) <= set(pids) and all(_stopped(pid) for pid in now):
            _signal(now, signal.SIGKILL)  # none was born meanwhile, and none runs
        if time.monotonic() > deadline:
            states = {pid: b"".join(_task_states(pid) or [b"-"]).decode() for pid in now[:10]}
            raise SandboxError(  # with each one's task states (R, S, D, T...), to say why
                f"processes of slot uids {uids} survived SIGKILL: {states}"
            )
        time.sleep(0.002)
        pids = processes_of(uids)
