"""rlimit backend, for inside a Fargate task (no CAP_SYS_ADMIN: no namespaces, mounts or
cgroups). What it enforces: setrlimit (AS, DATA, CPU, NPROC, FSIZE, NOFILE, CORE), a dedicated
uid per slot with no_new_privs and no groups, a new session, kill of the session plus kill(-1)
as the slot uid, capped output, a wall deadline and an explicit environment. The runner sets
PR_SET_DUMPABLE=0 on itself so a sandboxed process cannot read its environment (and the task's
credentials URI) from /proc.

What it cannot cover (the bwrap backend does; in AWS the VPC and one microVM per job do):
- no private /tmp: /tmp is shared with the worker (the sandbox env points TMPDIR at the
  workspace instead);
- host processes are visible in /proc (but not signallable: other uids);
- loopback and the network are reachable: isolation is the VPC's job (isolated subnets, no NAT,
  DNS firewall);
- no per-workspace disk cap: RLIMIT_FSIZE caps each file (EFBIG), not the total;
- no cgroup OOM signal: RLIMIT_AS makes allocations fail (MemoryError) instead of an OOM kill,
  so `oom` is never reported, and peak memory is the largest single process (ru_maxrss).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

from trialbox.sandbox.backend import Backend, CommandSpec, Launched, Measured
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.fs import unmount
from trialbox.sandbox.runtime import Runtime
from trialbox.sandbox.slots import Slot, kill_processes_of

PR_SET_DUMPABLE = 4
MiB = 1024 * 1024


def make_runner_undumpable() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class RlimitLaunched(Launched):
    def __init__(self, proc: subprocess.Popen[bytes], uid: int) -> None:
        super().__init__(proc)
        self.uid = uid
        self.rusage: resource.struct_rusage | None = None

    def kill_tree(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        # kill(-1) as the slot uid reaches every process of that uid, even a setsid daemon.
        subprocess.run(
            ["kill", "-s", "KILL", "--", "-1"],
            user=self.uid,
            group=self.uid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    def wait(self) -> int:
        if self.proc.returncode is None:
            _, status, self.rusage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        return self.proc.returncode

    def finish(self, returncode: int) -> Measured:
        usage = self.rusage
        cpu = (usage.ru_utime + usage.ru_stime) if usage else 0.0
        exit_code = returncode if returncode >= 0 else 128 - returncode
        return Measured(
            exit_code=exit_code,
            cpu_s=cpu,
            peak_memory_mb=round(usage.ru_maxrss / 1024, 2) if usage else 0.0,
            oom_killed=False,
        )


class RlimitBackend(Backend):
    name = "rlimit"
    caps_workspace = False  # a plain directory: a full disk is the host's

    def __init__(self, config: SandboxConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        make_runner_undumpable()

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
        if path.exists():
            shutil.rmtree(path)

    def release(self, slot: Slot) -> None:
        self.sweep(slot)

    def sweep(self, slot: Slot) -> None:
        kill_processes_of(slot.uids)
        for path in (slot.work_dir, slot.grade_dir):
            self.release_dir(path)
        slot.root.mkdir(parents=True, exist_ok=True)
        slot.root.chmod(0o711)

    def launch(self, slot: Slot, spec: CommandSpec, report_fd: int | None) -> Launched:
        uid = slot.agent_uid if spec.role == "agent" else slot.grader_uid
        limits = spec.limits
        memory = limits.memory_mb * MiB
        cpu_s = math.ceil(spec.timeout_s * limits.cpus) + 1
        argv = [
            "prlimit",
            f"--as={memory}",
            f"--data={memory}",
            f"--cpu={cpu_s}",
            f"--nproc={limits.pids}",
            f"--fsize={limits.disk_mb * MiB}",
            "--nofile=1024",
            "--core=0",
            "--",
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--",
            *spec.argv,
        ]
        env = dict(spec.env)
        env.update(HOME=str(spec.workdir), TMPDIR=str(spec.workdir))
        proc = subprocess.Popen(
            argv,
            cwd=spec.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[report_fd] if report_fd is not None else [],
            env=env,
            start_new_session=True,
        )
        return RlimitLaunched(proc, uid)
