"""The twin's pool workers as ECS tasks: each worker is a FARGATE task of the template's task
definition in moto's ECS (its ARN is the worker's name), runs in a memory cgroup of the task
definition's size, and is stopped in ECS with the reason ECS would give. A worker the kernel
killed for its cgroup's memory stops with ECS's "OutOfMemoryError: Container killed due to
memory usage"; a client that lost a session's worker reads that with ecs:DescribeTasks, on the
twin as on AWS. The sandboxes' own cgroups are outside the worker's, as Fargate's are not:
on the twin only what the worker process itself holds (a checkpoint it builds, say) counts."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialbox.sandbox.cgroups import Cgroup, cgroup_class
from trialbox.sandbox.config import SandboxConfig

log = logging.getLogger("trialbox.local")

OOM_REASON = "OutOfMemoryError: Container killed due to memory usage"  # ECS's words
PIDS = 1 << 20  # no pids cap on the worker itself: its sandboxes have their own


@dataclass(frozen=True)
class TaskShape:
    """What the template's task definition gives a worker."""

    cluster: str
    family: str
    memory_mb: int


@dataclass
class TwinTask:
    arn: str
    cgroup: Cgroup

    def join(self) -> None:  # pragma: no cover - runs in the child before exec
        """Move the calling process into the task's cgroup (from a preexec_fn)."""
        for procs in self.cgroup.procs_files:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)


class TwinTasks:
    """Starts and stops the pool's tasks in moto's ECS, each with its memory cgroup."""

    def __init__(self, ecs: Any, shape: TaskShape, memory_mb: int | None = None) -> None:
        self.ecs = ecs
        self.shape = shape
        self.memory_mb = memory_mb or shape.memory_mb
        config = SandboxConfig.from_env()
        self.cgroups = cgroup_class(config.cgroup_root)
        self.root = config.cgroup_root
        self.parent = f"{config.cgroup_parent}-twin-{os.getpid()}"
        self._sweep_dead_twins(f"{config.cgroup_parent}-twin-")

    def _sweep_dead_twins(self, prefix: str) -> None:
        """Remove the empty parent cgroups of twins that died without closing (killed)."""
        for path in self.cgroups(self.root, self.parent, "-").dirs:
            for stale in path.parent.parent.glob(prefix + "*"):
                pid = stale.name.removeprefix(prefix)
                if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                    continue  # a live twin's (or a reused pid's: left for later)
                with contextlib.suppress(OSError):  # a task cgroup with processes stays
                    for task in (entry for entry in stale.iterdir() if entry.is_dir()):
                        task.rmdir()
                    stale.rmdir()

    def start(self) -> TwinTask:
        answer = self.ecs.run_task(
            cluster=self.shape.cluster, taskDefinition=self.shape.family, launchType="FARGATE"
        )
        arn = str(answer["tasks"][0]["taskArn"])
        cgroup = self.cgroups(self.root, self.parent, arn.rsplit("/", 1)[-1])
        cgroup.create(self.memory_mb, PIDS, float(os.cpu_count() or 1))
        return TwinTask(arn, cgroup)

    def stopped(self, task: TwinTask, returncode: int | None) -> str:
        """Record the task's end in ECS; the reason given."""
        if returncode == -signal.SIGKILL and task.cgroup.stats().oom_kills:
            reason = OOM_REASON
        else:
            code = 128 - returncode if returncode is not None and returncode < 0 else returncode
            reason = f"Essential container in task exited (exit code {code})"
        try:
            self.ecs.stop_task(cluster=self.shape.cluster, task=task.arn, reason=reason)
        except Exception:  # the services may be stopping with the twin
            log.warning("%s: recording its stop in ECS failed", task.arn, exc_info=True)
        try:
            task.cgroup.remove()
        except Exception:  # a cgroup that still holds processes: the next twin sweeps it
            log.warning("%s: removing its cgroup failed", task.arn, exc_info=True)
        return reason

    def close(self) -> None:
        """Remove the tasks' parent cgroup (each task's own went when it stopped)."""
        for path in self.cgroups(self.root, self.parent, "-").dirs:
            with contextlib.suppress(OSError):
                path.parent.rmdir()
