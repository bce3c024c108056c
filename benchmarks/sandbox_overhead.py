"""Sandbox launch overhead: bare subprocess against the full bwrap runner, in one run.

Interleaved medians of N launches of `python -c pass` and of a 3-test pytest file. Both sides
use the sandbox runtime's interpreter and a new session (autogroup scheduling would skew it
otherwise). The runner side is everything a sample pays: slot claim, cgroups, tmpfs workspace,
materialization, bwrap, and for pytest the grading phase (copy, neutralize, overlay, trusted
plugin). Run: `make bench` or `.venv/bin/python benchmarks/sandbox_overhead.py -n 30`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trialbox.models import Limits, Sample, Task
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TESTS = (
    "from solution import add\n"
    "def test_one():\n    assert add(1, 2) == 3\n"
    "def test_two():\n    assert add(2, 2) == 4\n"
    "def test_three():\n    assert add(-1, 1) == 0\n"
)
SOLUTION = "def add(a, b):\n    return a + b\n"
TARGETS = {"python -c pass": 1.8, "pytest, 3 tests": 1.15}


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="launches per variant")
    args = parser.parse_args()

    runner = Runner()
    python = str(runner.runtime.python)
    task = Task.model_validate(
        {
            "task_id": "bench",
            "hidden_tests": {"tests/test_add.py": TESTS},
            "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
        }
    )
    sample = Sample(task_id="bench", sample_id="s", files={"solution.py": SOLUTION})

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "solution.py").write_text(SOLUTION)
        (work / "tests").mkdir()
        (work / "tests" / "test_add.py").write_text(TESTS)

        def bare(*argv: str) -> Callable[[], object]:
            def run() -> None:
                subprocess.run(
                    [python, *argv],
                    cwd=work,
                    start_new_session=True,
                    capture_output=True,
                    check=True,
                )

            return run

        def sandboxed_pytest() -> None:
            result = score(task.grading, runner.run(task, sample))
            assert result.reward == 1.0, result.feedback

        variants = {
            "python -c pass": (
                bare("-c", "pass"),
                lambda: runner.exec(["python", "-c", "pass"], Limits()),
            ),
            "pytest, 3 tests": (
                bare("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"),
                sandboxed_pytest,
            ),
        }
        samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in variants}
        for bare_run, sandbox_run in variants.values():  # warm-up
            bare_run()
            sandbox_run()
        for _ in range(args.n):
            for name, (bare_run, sandbox_run) in variants.items():
                samples[name][0].append(timed(bare_run))
                samples[name][1].append(timed(sandbox_run))

    report = {}
    print(f"median of {args.n} interleaved launches")
    print(f"{'workload':<18}{'bare ms':>10}{'bwrap ms':>10}{'ratio':>8}{'target':>8}")
    for name, (bare_times, sandbox_times) in samples.items():
        bare_ms = statistics.median(bare_times) * 1000
        sandbox_ms = statistics.median(sandbox_times) * 1000
        ratio = sandbox_ms / bare_ms
        print(f"{name:<18}{bare_ms:>10.1f}{sandbox_ms:>10.1f}{ratio:>8.2f}{TARGETS[name]:>8.2f}")
        report[name] = {"bare_ms": bare_ms, "bwrap_ms": sandbox_ms, "ratio": ratio}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
