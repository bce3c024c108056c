"""The performance scorer's noise on this machine: the reference graded as the solution, N
times. Reports the coefficient of variation of each side's CPU seconds and of their medians,
and how often the speed factor ranks this solution (equal to the reference) below 1: the rate
at which two equal solutions are ranked apart at the task's tolerance.

`--load cpu` or `--load memory` runs one busy process per core beside it (a spinning loop, or
one copying 256 MiB over and over): the neighbours a shared worker has.

Run: `make bench` or `.venv/bin/python benchmarks/performance_noise.py -n 20 --load cpu`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
from collections.abc import Iterator

from trialbox.models import Sample, Task
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score
from trialbox.scoring.performance import cv

REFERENCE = "def total(n):\n    return sum(range(n))\n"
TASK = {
    "task_id": "total",
    "workspace": {"solution.py": "def total(n):\n    raise NotImplementedError\n"},
    "reference": {"solution.py": REFERENCE},
    "hidden_tests": {
        "tests/test_total.py": "from solution import total\n"
        "def test_small():\n    assert total(10) == 45\n"
    },
    "grading": {
        "command": ["python", "-m", "pytest", "-q", "tests"],
        "scorer": "performance",
        "performance": {"workload": "from solution import total\nprint(total(10_000_000))\n"},
    },
    "limits": {"timeout_s": 30, "memory_mb": 512},
}


def _spin() -> None:
    while True:
        pass


def _copy() -> None:
    block = bytearray(256 << 20)
    while True:
        bytes(block)


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    target = {"cpu": _spin, "memory": _copy}.get(kind)
    workers = [
        multiprocessing.Process(target=target, daemon=True) for _ in range(os.cpu_count() or 1)
    ] if target else []  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()
            worker.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="gradings of the equal solution")
    parser.add_argument("--load", choices=["none", "cpu", "memory"], default="none")
    args = parser.parse_args()
    runner = Runner()
    task = Task.model_validate(TASK)
    tolerance = task.grading.performance.tolerance if task.grading.performance else 0.0
    runs_cv, ref_medians, medians, speed = [], [], [], []
    with load(args.load):
        for _ in range(args.n):
            sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": REFERENCE})
            result = score(task.grading, runner.run(task, sample))
            b = result.reward_breakdown
            runs_cv += [b["cpu_cv"], b["reference_cpu_cv"]]
            ref_medians.append(b["reference_cpu_s"])
            medians.append(b["cpu_s"])
            speed.append(b["speed_factor"])
    ratios = [m / r for m, r in zip(medians, ref_medians, strict=True)]
    print(
        json.dumps(
            {
                "gradings": args.n,
                "load": args.load,
                "repeats_per_side": task.grading.performance.repeats
                if task.grading.performance
                else None,
                "tolerance": tolerance,
                "median_cpu_s": round(statistics.median(ref_medians), 4),
                "cv_within_a_grading_median": round(statistics.median(runs_cv), 4),
                "cv_of_medians_across_gradings": round(cv(medians), 4),
                "ratio_solution_to_reference": {
                    "min": round(min(ratios), 3),
                    "median": round(statistics.median(ratios), 3),
                    "max": round(max(ratios), 3),
                },
                "ranked_apart_rate": round(sum(1 for s in speed if s < 1.0) / len(speed), 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
