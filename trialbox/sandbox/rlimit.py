"""rlimit backend, for inside a Fargate task (no CAP_SYS_ADMIN: no namespaces, mounts or
cgroups). What it enforces: setrlimit (AS, DATA, CPU, NPROC, FSIZE, NOFILE, CORE, MSGQUEUE), a
dedicated uid per slot with no_new_privs and no groups, a new session, kill of every process of
the slot uid (SIGKILL from root, whatever state each is in: see processes), a memory bound for
the whole sandbox (a watchdog over the slot uids' memory that kills past memory_mb and reports
`oom`: see watchdog), capped output, a wall deadline and an explicit environment. The runner
is undumpable, so a sandboxed process cannot read its environment (and the task's credentials
URI) from /proc; nothing runs as a slot uid with the runner's environment.

The command starts as the slot uid under a reaper (see reaper: a program of its own, never a
fork of the worker, whose memory would count in the command's peak), which forks it; it
switches uid and groups and installs the seccomp filter before it execs `prlimit`, so a
refused switch is the sandbox's failure (SandboxError), never the command's exit code. The
reaper reaps every process the command started, wherever it went, so the CPU time reported is
all of theirs. prlimit lowers the limits and execs `setpriv --no-new-privs`, which execs the
command; both come from util-linux, which every Debian image has.

Between jobs on one task, `sweep` wipes what the slot uids left anywhere writable (wipe.py), and
the worker checks `residue` before it takes the next job.

What it cannot cover (the bwrap backend does):
- no private /tmp: /tmp is shared with the worker (the sandbox env points TMPDIR at the
  workspace instead); after each command (not its companion) the wipe removes what the
  slot's uids left outside the slot's tree, so, as on bwrap, nothing one command or phase
  leaves in /tmp, /dev/shm or SysV IPC reaches the next, nor is charged to its memory;
- host processes are visible in /proc (but not signallable or readable: other uids);
- loopback and the network are reachable: egress is closed by the VPC (security groups to the
  endpoints only, endpoint policies, a DNS firewall);
- no per-workspace disk cap: RLIMIT_FSIZE caps each file (EFBIG), not the total;
- no cgroup: the sandbox's memory, one process's or the sum of all, is bounded by the
  watchdog's sampling (`oom` once over memory_mb), not by the kernel at the page, so it may
  pass memory_mb by what the sandbox allocates between two samples. RLIMIT_AS is only a
  backstop at the container's memory (an allocation past it is a MemoryError, as the kernel's
  overcommit would refuse it on bwrap on a machine of that size). Peak memory is the largest
  sample, or the largest single process (its reaper's ru_maxrss) when larger.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path

from trialbox.errors import SandboxError
from trialbox.sandbox import as_uid, processes, reaper, wipe
from trialbox.sandbox.backend import Backend, CommandSpec, Launched, Measured
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.fs import remove_tree, unmount
from trialbox.sandbox.runtime import Runtime
from trialbox.sandbox.slots import Slot
from trialbox.sandbox.warm import WarmCommand, WarmPool, WarmProc
from trialbox.sandbox.watchdog import MemoryWatchdog, tmpfs_places

MiB = 1024 * 1024


def _within_hard(kind: int, wanted: int) -> int:
    """A limit never above the worker's own hard limit, so lowering it cannot fail."""
    hard = resource.getrlimit(kind)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def container_memory() -> int:
    """Bytes of memory this container may use: its cgroup's limit where it has one (read-only
    is enough), else the machine's."""
    meminfo = Path("/proc/meminfo").read_text()
    total = int(meminfo.split("MemTotal:")[1].split()[0]) * 1024
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


class RlimitLaunched(Launched):
    def __init__(
        self,
        reaped: reaper.Reaped,
        uid: int,
        watchdog: MemoryWatchdog | None,
        wipe_outside: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(reaped.proc)  # the reaper's: its pipes are the command's
        self.reaped = reaped
        self.uid = uid
        self.watchdog = watchdog  # None for a companion: its slot's command watches both
        self.wipe_outside = wipe_outside  # None for a companion: its slot's command wipes

    def kill_tree(self) -> None:
        # Every process of the uid, wherever it went (a setsid daemon included).
        processes.kill_all((self.uid,))

    def exited(self, within: float = 0.0) -> bool:
        return self.reaped.exited(within)

    def wait(self) -> int:
        return self.reaped.wait()

    def discard(self) -> None:
        super().discard()
        self.reaped.close()

    def finish(self, returncode: int) -> Measured:
        # Every process the command started, reaped by its reaper: CPU time and largest one.
        totals = self.reaped.totals()
        exit_code = returncode if returncode >= 0 else 128 - returncode
        peak = totals.peak_mb
        oom = False
        if self.watchdog is not None:
            self.watchdog.stop()
            peak, oom = max(peak, self.watchdog.peak_mb), self.watchdog.exceeded
        if self.wipe_outside is not None:  # after the wall time: what bwrap's exit frees
            self.wipe_outside()
        cpu = totals.cpu_s
        return Measured(exit_code=exit_code, cpu_s=cpu, peak_memory_mb=peak, oom_killed=oom)


class RlimitBackend(Backend):
    name = "rlimit"
    caps_workspace = False  # a plain directory: a full disk is the host's

    def __init__(self, config: SandboxConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        mountinfo = wipe.MOUNTINFO.read_text()
        self.places = wipe.writable_places(mountinfo)
        self.memory_places = tmpfs_places(mountinfo)
        self.backstop = container_memory()
        as_uid.refuse_dumpable_setuid()
        as_uid.make_undumpable()
        as_uid.scrub_environment_block()
        as_uid.seal_session_keyring()
        self.warm = WarmPool(runtime.python) if config.warm else None
        self._sharing: dict[int, list[int]] = {}  # by slot: the warm pids its command shares

    def prepare_dir(
        self, path: Path, size_mb: int, owner: int, group: int, mode: int, inodes: int = 65536
    ) -> None:
        self.release_dir(path)
        path.mkdir(mode=mode)
        os.chown(path, owner, group)
        path.chmod(mode)

    def release_dir(self, path: Path) -> None:
        if os.path.ismount(path):  # left by the bwrap backend on a machine that has both
            unmount(path)
        remove_tree(path)

    def release(self, slot: Slot) -> None:
        self.sweep(slot)

    def sweep(self, slot: Slot) -> None:
        self.sweep_many([slot])

    def sweep_many(self, slots: list[Slot]) -> None:
        """One pass for all of them: the wipe walks every writable place once."""
        uids = tuple(uid for slot in slots for uid in slot.uids)
        processes.kill_all(uids)
        for slot in slots:
            for path in (slot.work_dir, slot.grade_dir, slot.scratch_dir):
                self.release_dir(path)
            slot.root.mkdir(parents=True, exist_ok=True)
            slot.root.chmod(0o711)
        wipe.wipe(uids, self.places)

    def residue(self, uids: tuple[int, ...]) -> list[str]:
        return wipe.residue(uids, self.places)

    def launch(self, slot: Slot, spec: CommandSpec, fds: list[int], join: bool = False) -> Launched:
        uid = slot.agent_uid if spec.role == "agent" else slot.grader_uid
        limits = spec.limits
        # The sandbox's memory is the watchdog's to bound (`oom`, as bwrap's cgroup): a
        # process's address space is capped only at what the container has, a backstop that
        # refuses what the kernel's overcommit would refuse on a machine of that size anyway.
        memory = max(limits.memory_mb * MiB, self.backstop)
        wanted = {
            "as": (resource.RLIMIT_AS, memory),
            "data": (resource.RLIMIT_DATA, memory),
            "cpu": (resource.RLIMIT_CPU, math.ceil(spec.timeout_s * limits.cpus) + 1),
            "nproc": (resource.RLIMIT_NPROC, limits.pids),
            "fsize": (resource.RLIMIT_FSIZE, limits.disk_mb * MiB),
            "nofile": (resource.RLIMIT_NOFILE, 1024),
            "core": (resource.RLIMIT_CORE, 0),
            # No POSIX message queues: they would outlive the job where /dev/mqueue is not
            # mounted for the wipe to see them.
            "msgqueue": (resource.RLIMIT_MSGQUEUE, 0),
        }
        rlimits = [(kind, _within_hard(kind, value)) for kind, value in wanted.values()]
        argv = [
            "prlimit",
            *(f"--{name}={value}" for name, (_, value) in zip(wanted, rlimits, strict=True)),
            "--",
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
            "--",
            *spec.argv,
        ]
        env = dict(spec.env)
        # HOME and TMPDIR somewhere the command's uid may write: there is no private /tmp,
        # and the task's /tmp volume may be root's 0755. The grader's tree is read-only to it.
        writable = spec.workdir
        if spec.role == "grader":
            writable = slot.scratch_dir
            self.prepare_dir(writable, 0, uid, uid, 0o700)
        env.update(HOME=str(writable), TMPDIR=str(writable))
        # One bound for the slot's command and its companion (both uids), as bwrap's cgroup,
        # which the pages they share with warm processes count in full.
        if not join:
            self._sharing[slot.index] = []
        sharing = self._sharing[slot.index]
        watchdog = (
            None
            if join
            else MemoryWatchdog(slot.uids, limits.memory_mb, self.memory_places, sharing.copy)
        )
        try:
            warm = self._warm_launch(slot, spec, uid, env, fds, rlimits)
            if warm is not None:
                reaped, pids = warm
                sharing += pids
            else:
                reaped = reaper.start(argv, uid, spec.workdir, env, fds)
        except (OSError, subprocess.SubprocessError) as exc:  # never the command's failure
            why = f"the sandbox could not start the command as uid {uid}: {exc}"
            raise SandboxError(why) from exc
        if watchdog is not None:
            watchdog.start()
        # Once the command is over, nothing it left outside the slot's tree reaches the next.
        wipe_outside = partial(wipe.wipe_outside, slot.uids, self.places, slot.root)
        return RlimitLaunched(reaped, uid, watchdog, None if join else wipe_outside)

    def _warm_launch(
        self,
        slot: Slot,
        spec: CommandSpec,
        uid: int,
        env: dict[str, str],
        fds: list[int],
        rlimits: list[tuple[int, int]],
    ) -> tuple[reaper.Reaped, list[int]] | None:
        """The command forked from the slot's warm process, when it can be (None: it starts
        cold), and the pids of that warm process and the command's reaper, whose pages the
        command shares. What prlimit and setpriv do, its first process does itself."""
        module = self.warm_module(spec)
        if self.warm is None or module is None:
            return None
        command = WarmCommand(
            argv=spec.argv, uid=uid, cwd=spec.workdir, env=env, fds=fds, rlimits=rlimits
        )
        reaped = self.warm.launch(slot.index, module, command)
        server = self.warm.server(slot.index, module)
        if reaped is None or server is None or not isinstance(reaped.proc, WarmProc):
            return None if reaped is None else (reaped, [])
        return reaped, [server.proc.pid, reaped.proc.pid]
