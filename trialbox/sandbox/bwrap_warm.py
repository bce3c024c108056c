"""Warm graders on the bwrap backend (why warm: trialbox/sandbox/warm.py).

Each command still gets a sandbox of its own: bwrap starts, as it does for a cold command,
with every namespace new, the slot's mounts, a private /tmp and /dev/shm and the per-command
cgroup, but runs only a holder (HOLDER: a shell that execs `sleep`, no interpreter) in it.
The command itself is a fork of the slot's warm process (root, outside any sandbox): its
reaper enters the holder's pid namespace, and the command's first process, still root, joins
the sandbox's cgroup and the holder's other namespaces, becomes the uid the sandbox runs as,
then joins the holder's user namespace too (outside it, as the uid that owns it, it would hold
every capability over the sandbox), and runs the module as on rlimit. Everything the command
starts lives in that sandbox and dies with it; nothing of one sandbox is reused by the next.

Memory: the pages the command shares with its warm parent (pytest's, imported once) were
charged to the warm process's cgroup, not the sandbox's. So the sandbox's limit is lowered,
and its peak raised, by what a command forked from that warm process still shares with it
once it ran (measured by the warm process at its start: warm_process._still_shared_kib), for
the command and its companion: a sample is `oom` where a cold start of it would be
(tests/sandbox/test_warm_parity.py, benchmarks/warm_parity.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from trialbox.errors import SandboxError
from trialbox.sandbox import reaper
from trialbox.sandbox.backend import CommandSpec, Launched, Measured
from trialbox.sandbox.cgroups import Cgroup
from trialbox.sandbox.warm import WarmCommand

if TYPE_CHECKING:
    from trialbox.sandbox.bwrap import BwrapBackend, BwrapLaunched
    from trialbox.sandbox.slots import Slot

# It says so once bwrap has made the sandbox (its namespaces, mounts and root are final then;
# bwrap tells its pid before), and holds it until the cgroup is killed. It is the sandbox's
# pid 1 (--as-pid-1), which no signal from inside kills, and the command pid 2, as cold.
HOLDER = ("/bin/sh", "-c", "echo ready && exec sleep infinity")
READY_WAIT_S = 30.0


def _ready(holder: BwrapLaunched) -> None:
    stdout = holder.proc.stdout
    assert stdout is not None
    if not select.select([stdout], [], [], READY_WAIT_S)[0] or not stdout.readline():
        raise SandboxError("bwrap did not start the sandbox's holder in time")


def _child_pid(status_fd: int) -> int:
    """The holder's host pid, from bwrap's JSON status (its first document)."""
    told = b""
    deadline = time.monotonic() + READY_WAIT_S
    decoder = json.JSONDecoder()
    while True:
        text = told.decode(errors="replace").strip()
        with contextlib.suppress(ValueError):
            document, _ = decoder.raw_decode(text)
            if isinstance(document, dict) and isinstance(document.get("child-pid"), int):
                return int(document["child-pid"])
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([status_fd], [], [], left)[0]:
            raise SandboxError("bwrap did not start the sandbox's holder in time")
        chunk = os.read(status_fd, 4096)
        if not chunk:
            raise SandboxError("bwrap exited before the sandbox's holder started")
        told += chunk


class BwrapWarmLaunched(Launched):
    """A command forked from a warm process into a sandbox bwrap made for it."""

    def __init__(
        self,
        holder: BwrapLaunched,
        reaped: reaper.Reaped,
        cgroup: Cgroup,
        shared_mb: Callable[[], float],
        ended: Callable[[], None],
    ) -> None:
        """`shared_mb`: what the slot's command and companion share with their warm processes
        (its companion starts after it). `ended`: called once the cgroup is killed."""
        super().__init__(reaped.proc)
        self.holder = holder
        self.reaped = reaped
        self.cgroup = cgroup
        self.shared_mb = shared_mb
        self.ended = ended

    def kill_tree(self) -> None:
        self.cgroup.kill_all()  # the holder, the command, all they started

    def exited(self, within: float = 0.0) -> bool:
        return self.reaped.exited(within)

    def wait(self) -> int:
        return self.reaped.wait()

    def discard(self) -> None:
        super().discard()
        self.reaped.close()
        self.holder.discard()
        self.ended()

    def finish(self, returncode: int) -> Measured:
        stats = self.cgroup.stats()
        with contextlib.suppress(SandboxError):
            self.reaped.totals()  # the reaper's end (the cgroup's figures are the command's)
        self.holder.discard()
        self.ended()
        if not self.cgroup.REUSABLE:
            self.cgroup.remove()
        # bwrap's own rule for a signal's death: 128 + its number.
        exit_code = returncode if returncode >= 0 else 128 - returncode
        return Measured(
            exit_code=exit_code,
            cpu_s=stats.cpu_s,
            peak_memory_mb=round(stats.peak_memory_mb + self.shared_mb(), 2),
            oom_killed=stats.oom_kills > 0,
        )


def _holder_spec(spec: CommandSpec) -> CommandSpec:
    return replace(spec, argv=HOLDER, report=False, channel=None)


def _start_companions_holder(backend: BwrapBackend, slot: Slot, spec: CommandSpec) -> None:
    """The companion's holder (the policy's sandbox, beside the grader's), started now so that
    the two sandboxes are made at once rather than one after the other: a new sandbox like any
    other, with nothing in it until the companion's launch takes it; only when a warm process
    is ready to take it. One never taken dies with the slot's cgroup, and is reaped when the
    command ends (`discard_early_holder`)."""
    companion = spec.companion
    if companion is None or backend.warm is None:
        return
    module = backend.warm_module(companion)
    if module is None or backend.warm.ready(slot.index, module, companion.env) is None:
        return
    backend.early_holders[slot.index] = backend.launch_cold(
        slot, _holder_spec(companion), [], True, as_pid_1=True
    )


def _holder(backend: BwrapBackend, slot: Slot, spec: CommandSpec, join: bool) -> BwrapLaunched:
    """The command's holder: for a companion, the one started beside its command's if it is
    still there; else a new one."""
    holder = backend.early_holders.pop(slot.index, None) if join else None
    if holder is not None and holder.proc.poll() is not None:
        holder.discard()
        holder = None
    if holder is None:
        holder = backend.launch_cold(slot, _holder_spec(spec), [], join, as_pid_1=True)
    return holder


def warm_launch(
    backend: BwrapBackend, slot: Slot, spec: CommandSpec, fds: list[int], join: bool
) -> Launched | None:
    """The command in a sandbox of its own, forked from the slot's warm process; None when it
    cannot be (it starts cold)."""
    if not join:  # one a failed launch left (killed with the cgroup, not yet reaped)
        backend.discard_early_holder(slot)
    warm, module = backend.warm, backend.warm_module(spec)
    if (
        warm is None
        or module is None
        or (server := warm.ready(slot.index, module, spec.env)) is None
    ):
        backend.discard_early_holder(slot)  # a companion's, untaken: it starts cold
        return None
    # The boundary where a cold start of it would be oom: the slot's limit lowered by what its
    # command and companion share with their warm processes (charged to those, not the slot).
    shared = backend.shared_mb
    shared[slot.index] = server.shared_mb + (shared.get(slot.index, 0.0) if join else 0.0)
    memory_mb = max(1, int(spec.limits.memory_mb - shared[slot.index]))
    holder = _holder(backend, slot, spec, join)
    cgroup = holder.cgroup
    cgroup.limit(memory_mb, spec.limits.pids, spec.limits.cpus)
    held: list[int] = []  # the holder's pidfd and the cgroup's procs files, for the fork
    try:
        if not join:
            _start_companions_holder(backend, slot, spec)
        held.append(os.pidfd_open(_child_pid(holder.status_fd)))  # the sandbox's pid 1
        _ready(holder)
        held += [os.open(path, os.O_WRONLY) for path in cgroup.procs_files]
        uid = slot.agent_uid if spec.role == "agent" else slot.grader_uid
        command = WarmCommand(argv=spec.argv, uid=uid, cwd=backend.sandbox_workdir,
                              env=spec.env, fds=fds, enter=held, nice=0)  # fmt: skip
        reaped = warm.launch(slot.index, module, command)
    except BaseException:
        holder.discard()
        backend.discard_early_holder(slot)
        raise
    finally:
        for fd in held:
            os.close(fd)
    if reaped is None:  # killed: the whole cgroup, or (a companion's) its own sandbox only
        holder.discard()
        backend.discard_early_holder(slot)
        return None
    return BwrapWarmLaunched(
        holder,
        reaped,
        cgroup,
        lambda: shared[slot.index],
        lambda: backend.discard_early_holder(slot),
    )
