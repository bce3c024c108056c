"""weighted_tests and performance, graded for real (trialbox/scoring/)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Sample, Status, Task
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

SMALL_ONLY = "def add(a, b):\n    return 3 if (a, b) == (1, 2) else 0\n"


def _grade(runner: Runner, task: Task, code: str) -> ExecutionResult:
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": code})
    return score(task.grading, runner.run(task, sample))


def _weighted(weights: Any) -> Task:
    raw = json.loads(json.dumps(ADD_TASK))
    raw["grading"] |= {"scorer": "weighted_tests", "weights": weights}
    return Task.model_validate(raw)


def test_weighted_tests_weigh_each_passed_test(runner: Runner) -> None:
    task = _weighted({"tests/test_add.py::test_small": 3.0})  # test_negative weighs 1
    assert _grade(runner, task, SMALL_ONLY).reward == 0.75
    assert _grade(runner, task, CORRECT).reward == 1.0


@pytest.mark.parametrize(
    "weights", [{}, {"tests/test_add.py::test_small": 0}, {"tests/test_add.py::test_nope": 1}]
)
def test_bad_weights_are_refused(weights: Any) -> None:
    with pytest.raises(ValidationError):
        _weighted(weights)


SUM_REFERENCE = "def total(n):\n    return sum(range(n))\n"
PERF_TASK: dict[str, Any] = {
    "task_id": "total",
    "workspace": {"solution.py": "def total(n):\n    raise NotImplementedError\n"},
    "reference": {"solution.py": SUM_REFERENCE},
    "hidden_tests": {
        "tests/test_total.py": (
            "from solution import total\n"
            "def test_small():\n    assert total(10) == 45\n"
            "def test_zero():\n    assert total(0) == 0\n"
        )
    },
    "grading": {
        "command": ["python", "-m", "pytest", "-q", "tests"],
        "scorer": "performance",
        # A wide tolerance and 7 runs a side: this test checks the mechanism, not this
        # machine's noise (that is benchmarks/performance_noise.py's). The workload takes
        # well over the interpreter's start, as PerformanceSpec asks: at 4,000,000 (about
        # 30 ms over a start of 20) a loaded CI machine once timed the reference's own code
        # at 1.6x the reference. The slow solution is about 6x the reference, so its factor
        # (about 0.25) stays under 0.7 even if noise halves the gap.
        "performance": {
            "workload": "from solution import total\nprint(total(12_000_000))\n",
            "tolerance": 0.5,
            "repeats": 7,
        },
    },
    "limits": {"timeout_s": 20, "memory_mb": 512},
}
# The same answers, computed by a Python while loop: several times the CPU of sum(range(n)).
SLOW = (
    "def total(n):\n    t = i = 0\n    while i < n:\n        t += i\n        i += 1\n    return t\n"
)


def _perf(**changes: Any) -> Task:
    raw = json.loads(json.dumps(PERF_TASK))
    raw["grading"]["performance"] |= changes
    return Task.model_validate(raw)


def test_performance_scores_speed_against_the_reference(runner: Runner) -> None:
    task = _perf()
    same = _grade(runner, task, SUM_REFERENCE)
    assert (same.status, same.reward) == (Status.SUCCEEDED, 1.0), same.reward_breakdown
    assert same.reward_breakdown["speed_factor"] == 1.0
    slow = _grade(runner, task, SLOW)
    assert slow.status == Status.SUCCEEDED
    assert slow.reward is not None and 0 < slow.reward < 0.7, slow.reward_breakdown
    assert slow.reward_breakdown["cpu_s"] > slow.reward_breakdown["reference_cpu_s"]
    half = _grade(runner, task, "def total(n):\n    return 0 if n == 0 else -1\n")
    assert half.reward == 0.0  # one test of two, x no speed factor: its workload printed -1
    assert "printed other results than the reference's workload" in half.feedback


def test_a_failing_workload_is_the_solutions_zero_and_a_failing_reference_the_scorers(
    runner: Runner,
) -> None:
    task = _perf()
    crashes = (
        "def total(n):\n    if n > 100:\n        raise MemoryError\n    return sum(range(n))\n"
    )
    result = _grade(runner, task, crashes)
    assert (result.status, result.reward, result.loss_mask) == (Status.SUCCEEDED, 0.0, False)
    raw = json.loads(json.dumps(PERF_TASK))
    raw["reference"] = {"solution.py": "def total(n):\n    raise RuntimeError('broken')\n"}
    broken = Task.model_validate(raw)
    result = _grade(runner, broken, SUM_REFERENCE)
    assert (result.status, result.reward, result.loss_mask) == (
        Status.SANDBOX_ERROR, None, True,
    )  # fmt: skip
    assert "reference" in (result.error or "")


def test_a_solution_that_cuts_corners_when_it_is_not_under_test_scores_zero(
    runner: Runner,
) -> None:
    # Was a break: the timed runs' results went unchecked, and a solution can tell them from
    # grading (no pytest, no wire in sys.modules): right when tested, instant when timed.
    shortcut = (
        "import sys\n"
        "def total(n):\n"
        "    if 'pytest' in sys.modules or 'trialbox_wire' in sys.modules:\n"
        "        return sum(range(n))\n"
        "    return 0\n"
    )
    result = _grade(runner, _perf(), shortcut)
    assert (result.status, result.reward, result.loss_mask) == (Status.SUCCEEDED, 0.0, False)
    assert "printed other results" in result.feedback


def test_performance_needs_its_spec_and_a_reference() -> None:
    raw = json.loads(json.dumps(PERF_TASK))
    del raw["reference"]
    with pytest.raises(ValidationError, match="reference"):
        Task.model_validate(raw)
    raw = json.loads(json.dumps(PERF_TASK))
    del raw["grading"]["performance"]
    with pytest.raises(ValidationError, match="performance"):
        Task.model_validate(raw)
