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

A process can outlive its SIGKILL in an uninterruptible sleep: sync(2) waiting for gigabytes
of dirty pages to reach the disk, say. It is dying all the same (SIGKILL pending, or already
exiting): it never runs its own code again, it only finishes the system call it is in. So
the kill waits WAIT_GONE_S for it, then hands it back as dying instead of failing the run
(whose outcome is known by then: a SandboxError would mask it), and does not wait for the
same process again; the slot it belongs to is not given out again until it is gone
(slots.SlotPool's quarantine). Only a process that is not dying fails the kill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from trialbox.errors import SandboxError

WAIT_GONE_S = 5.0
DEAD = (b"Z", b"X")
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
PF_EXITING = 0x4
# (pid, start time) of dying processes a kill already waited WAIT_GONE_S for.
_waited: set[tuple[int, int]] = set()


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


def _task_dying(task: str) -> bool:
    """The task (a /proc/<pid>/task/<tid> path) has SIGKILL pending, is exiting, or is gone."""
    try:
        with open(f"{task}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open(f"{task}/status", "rb") as status:
            lines = status.read().splitlines()
    except OSError:
        return True
    if fields[0] in DEAD or int(fields[6]) & PF_EXITING:
        return True
    pending = 0
    for line in lines:
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & SIGKILL_BIT)


def dying(pid: int) -> bool:
    """Every task of the thread group has SIGKILL pending or is exiting (or is gone): it
    never runs user code again, whatever state it is in."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all(_task_dying(f"/proc/{pid}/task/{tid}") for tid in tasks)


def _identity(pid: int) -> tuple[int, int]:
    """(pid, start time): a pid the kernel hands out again is another process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return pid, int(stat.read().rsplit(b")", 1)[1].split()[19])
    except OSError:
        return pid, -1


def _signal(pids: list[int], uids: tuple[int, ...], sig: signal.Signals) -> None:
    """Signal each of `pids` that is a process of `uids` when it is signalled. A pid from an
    earlier scan may since have been handed to another process (root's, another slot's): the
    process is held by a pidfd first, its owner read after that (so it is the held one's, or
    the held one is gone and the signal reaches nothing), and the pidfd is signalled."""
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # gone
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid in uids:
                signal.pidfd_send_signal(pidfd, sig)
        except PermissionError as exc:
            raise SandboxError(f"cannot signal slot processes ({exc}): is CAP_KILL kept?") from exc
        except OSError:  # gone
            continue
        finally:
            os.close(pidfd)


def kill_all(uids: tuple[int, ...]) -> list[int]:
    """SIGKILL every process of the uids, again while any is left, and wait until all are
    gone. Returns those still dying after WAIT_GONE_S (at once for those an earlier call
    waited for); [] when all are gone. A SandboxError naming each survivor's task states
    when one that is not dying is left after WAIT_GONE_S."""
    _waited.intersection_update(_identity(pid) for pid, _ in list(_waited))  # the gone
    deadline = time.monotonic() + WAIT_GONE_S
    while pids := processes_of(uids):
        _signal(pids, uids, signal.SIGKILL)
        known = {_identity(pid) for pid in pids}
        if known <= _waited and all(dying(pid) for pid in pids):
            return pids
        if time.monotonic() > deadline:
            alive = [pid for pid in pids if not dying(pid)]
            if alive:
                states = {pid: b"".join(_task_states(pid) or [b"-"]).decode() for pid in alive[:10]}
                raise SandboxError(  # with each one's task states (R, S, D, T...), to say why
                    f"processes of slot uids {uids} survived SIGKILL: {states}"
                )
            _waited.update(known)
            return pids
        time.sleep(0.002)
    return []
