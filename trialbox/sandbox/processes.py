"""Every process of the slot uids, and killing them from root, from outside (CAP_KILL): a slot
uid cannot signal root, so nothing it left can stop or outrun the kill.

Each pass sends SIGKILL to every process of the uids at once, whatever state it is in, and
passes repeat until none is left. SIGKILL needs no cooperation: a stopped process, one in a
killable wait (a vfork parent whose child is stopped, a ptrace stop) and one that ignores every
other signal all die. An earlier design stopped every process first and killed only once none
ran; a process that cannot stop (that vfork parent, in D) kept the kill from ever happening.
A fork bomb cannot outrun the passes: a process with SIGKILL pending cannot finish a fork
(copy_process refuses it), so each pass leaves only children born during its own /proc scan,
and RLIMIT_NPROC counts the dying ones until they are reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from trialbox.errors import SandboxError

WAIT_GONE_S = 5.0
DEAD = (b"Z", b"X")


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


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            raise SandboxError(f"cannot signal slot processes ({exc}): is CAP_KILL kept?") from exc


def kill_all(uids: tuple[int, ...]) -> None:
    """SIGKILL every process of the uids, again while any is left, and wait until all are
    gone; a SandboxError naming each survivor's task states after WAIT_GONE_S."""
    deadline = time.monotonic() + WAIT_GONE_S
    while pids := processes_of(uids):
        _signal(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            states = {pid: b"".join(_task_states(pid) or [b"-"]).decode() for pid in pids[:10]}
            raise SandboxError(  # with each one's task states (R, S, D, T...), to say why
                f"processes of slot uids {uids} survived SIGKILL: {states}"
            )
        time.sleep(0.002)
