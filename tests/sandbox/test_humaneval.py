"""HumanEval coverage under the boundary: all 164 canonical solutions, in HumanEval's own test
form (`from solution import *`, the problem's `check`), score 1.0 with no flag (bwrap here;
rlimit as worker jobs in tests/fargate/test_grading_integrity.py), and a wrong solution still
fails (the same tasks graded with the untouched starter)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from trialbox.models import Sample, Status, Task
from trialbox.models.result import ExecutionResult
from trialbox.models.task import Isolation
from trialbox.qc import humaneval
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TASKS = [Task.model_validate(t) for t in humaneval.tasks()]


@pytest.fixture(scope="module")
def backend() -> Runner:
    """bwrap here; the rlimit backend runs the same cases as jobs through the worker under the
    task definition's constraints (tests/fargate/test_grading_integrity.py)."""
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))


def _grade(runner: Runner, task: Task, reference: bool) -> ExecutionResult:
    files = task.reference if reference else task.workspace
    assert files is not None
    sample = Sample(task_id=task.task_id, sample_id="s", files=dict(files))
    return score(task.grading, runner.run(task, sample))


def test_every_canonical_solution_scores_one_with_no_flag(backend: Runner) -> None:
    assert len(TASKS) == 164
    assert {t.grading.isolation for t in TASKS} == {Isolation.BOUNDARY}
    # As many at once as the machine has cores: more adds no speed, only load on the suite's
    # other workers, whose wall-clock limits it would turn into timeouts.
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda t: _grade(backend, t, True), TASKS))
    wrong = [
        (task.task_id, r.status.value, r.reward, r.flags, r.feedback[:400])
        for task, r in zip(TASKS, results, strict=True)
        if (r.status, r.reward, r.flags) != (Status.SUCCEEDED, 1.0, [])
    ]
    assert wrong == []


def test_the_starters_fail(runner: Runner) -> None:
    sample = TASKS[::16]
    results = [_grade(runner, task, False) for task in sample]
    assert [(r.status, r.reward) for r in results] == [(Status.SUCCEEDED, 0.0)] * len(sample)


@pytest.mark.parametrize("kind", ["bytearray", "bytes", "ndarray"])
def test_a_large_global_the_tests_star_import_costs_its_size_not_a_multiple(
    backend: Runner, kind: str
) -> None:
    """Was a break: `from solution import *` copies every global of the solution's into the
    grader, and the wire made a bytes-like one cost about six times its size in transit (base64,
    in a JSON string, in a frame: 950 MiB at once for 150 MiB), so an honest solution that
    holds a 150 MiB table ended `oom` at 512 MiB where a bare pytest run passes it."""
    task = TASKS[0]
    assert task.reference is not None and task.limits.memory_mb == 512
    held = {
        "bytearray": "HELD = bytearray(150 * 2**20)\n",
        "bytes": "HELD = b'x' * (150 * 2**20)\n",
        "ndarray": "import numpy\nHELD = numpy.ones(150 * 2**17)\n",  # float64: 150 MiB
    }[kind]
    code = held + "HELD[::4096]\n" + str(task.reference["solution.py"])
    sample = Sample(task_id=task.task_id, sample_id=kind, files={"solution.py": code})
    result = score(task.grading, backend.run(task, sample))
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.feedback
