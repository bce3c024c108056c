"""The twin's task cgroups: a twin killed before it closed (kill -9, a crashed test) leaves its
parent cgroup behind; the next twin removes it, and never a live twin's."""

from __future__ import annotations

import os
import subprocess

from trialbox.local.tasks import TaskShape, TwinTasks
from trialbox.sandbox.cgroups import cgroup_class
from trialbox.sandbox.config import SandboxConfig


def test_a_new_twin_removes_the_empty_cgroups_of_dead_twins() -> None:
    config = SandboxConfig.from_env()
    cgroups = cgroup_class(config.cgroup_root)
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead = cgroups(config.cgroup_root, f"{config.cgroup_parent}-twin-{ended.pid}", "task-1")
    live = cgroups(config.cgroup_root, f"{config.cgroup_parent}-twin-{os.getppid()}", "task-1")
    for left in (dead, live):
        for path in left.dirs:
            path.mkdir(parents=True, exist_ok=True)
    try:
        TwinTasks(None, TaskShape("cluster", "family", 512))
        assert not any(path.parent.exists() for path in dead.dirs)
        assert all(path.exists() for path in live.dirs)  # its twin (here: pid) still runs
    finally:
        for left in (dead, live):
            for path in left.dirs:
                for directory in (path, path.parent):
                    if directory.exists():
                        directory.rmdir()
