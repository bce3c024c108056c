"""The wipe between two jobs on one rlimit worker (what reuse costs), in one run.

For N rounds, interleaved: a graded job (the add-two task, correct solution) on the rlimit
runner, which ends with the slot's release (kill as the slot uid, wipe of every writable place,
SysV IPC and keyrings); then the worker's check that nothing is left (`Runner.residue`), timed
apart. The same after a hostile job that leaves something everywhere (tests/sandbox LEFTOVERS).
It reports medians and the wipe + check as a fraction of the graded job, and against Fargate's
30-45 s task start (what `recycle_after_jobs = 1` pays per job instead).

It runs in a private mount namespace laid out like the Fargate task (a read-only root; tmpfs
on /tmp, /dev/shm and the slot state dir), so the wipe walks what it walks there, not this
host's /tmp. Run: `make bench` or `.venv/bin/python benchmarks/wipe.py -n 20` (as root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from trialbox.models import Sample, Task
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner

TASK: dict[str, Any] = {
    "task_id": "bench",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": (
            "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
        )
    },
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
SOLUTION = "def add(a, b):\n    return a + b\n"
# A short copy of tests/sandbox/conftest.py LEFTOVERS (benchmarks do not import tests).
LEFTOVERS = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None)\n"
    "for place in ('/tmp', '/dev/shm'):\n"
    "    open(f'{place}/bench-leftover-{os.getuid()}', 'w').write('x')\n"
    "libc.shmget(0x7B0101, 4096, 0o1666); libc.semget(0x7B0102, 1, 0o1666)\n"
    "libc.msgget(0x7B0103, 0o1666)\n"
    "if os.fork() == 0:\n"
    "    os.setsid(); import time; time.sleep(60)\n"
    "os._exit(0)\n"
)
FARGATE_START_S = (30.0, 45.0)
IN_NAMESPACE = "TRIALBOX_BENCH_FARGATE_MOUNTS"
# The task's layout: a read-only root, writable scratch volumes and /dev/shm.
FARGATE_MOUNTS = (
    "mount -o remount,bind,ro / && "
    "mount -t tmpfs -o mode=1777 tmpfs /tmp && "
    "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
    "mount -t tmpfs -o mode=711 tmpfs {state}"
)


def in_fargate_layout() -> None:
    """Re-run this script in a private mount namespace laid out like the task."""
    if os.environ.get(IN_NAMESPACE):
        return
    state = SandboxConfig.from_env().state_dir
    script = FARGATE_MOUNTS.format(state=state) + ' && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    env = os.environ | {IN_NAMESPACE: "1", "PYTHONDONTWRITEBYTECODE": "1"}
    sys.exit(subprocess.run([*argv, sys.executable, *sys.argv], env=env).returncode)


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="rounds")
    args = parser.parse_args()
    in_fargate_layout()
    runner = Runner(SandboxConfig.from_env().model_copy(update={"backend": "rlimit", "slots": 1}))
    slot = runner.slots.slot(0)
    task = Task.model_validate(TASK)
    sample = Sample(task_id="bench", sample_id="s", files={"solution.py": SOLUTION})
    times: dict[str, list[float]] = {k: [] for k in ("job", "wipe", "check", "hostile wipe")}
    for _ in range(args.n):
        times["job"].append(timed(lambda: runner.run(task, sample)))
        times["wipe"].append(timed(lambda: runner.backend.sweep(slot)))
        times["check"].append(timed(runner.residue))
        # Planted as the slot uid would, outside a job (whose release would wipe it first).
        subprocess.run(
            [str(runner.runtime.python), "-c", LEFTOVERS],
            user=slot.agent_uid,
            group=slot.agent_uid,
            extra_groups=[],
            start_new_session=True,
            check=True,
        )
        runner.slots.used.add(slot.index)  # as a job in it would
        planted = runner.residue()
        runner.slots.used.add(slot.index)
        times["hostile wipe"].append(timed(lambda: runner.backend.sweep(slot)))
        assert len(planted) >= 5 and runner.residue() == [], (planted, runner.residue())
    medians = {k: statistics.median(v) for k, v in times.items()}
    between = medians["wipe"] + medians["check"]
    report = {
        "rounds": args.n,
        "writable places walked": [str(p) for p in getattr(runner.backend, "places", [])],
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "wipe_plus_check_s": round(between, 4),
        "wipe_plus_check_vs_graded_job": round(between / medians["job"], 3),
        "for a 10 s job": {
            "reuse: overhead per job": f"{between / 10:.2%}",
            "recycle_after_jobs=1: task start per job": (
                f"{FARGATE_START_S[0] / 10:.0%}-{FARGATE_START_S[1] / 10:.0%}"
            ),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
