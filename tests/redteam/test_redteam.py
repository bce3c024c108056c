"""The red-team corpus (tests/redteam/hacks.py) on bwrap (rlimit: as worker jobs in
tests/fargate/test_grading_integrity.py): every hack scores 0, with
`integrity_violation` where a detector must name it, never a loss-masked `sandbox_error`; every
reference scores 1.0 with no flag."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.redteam.hacks import ADD, HACKS, TASKS, Hack
from trialbox.models import Sample, Status, Task
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


@pytest.fixture(scope="module")
def backend() -> Runner:
    """bwrap here; the rlimit backend runs the same cases as jobs through the worker under the
    task definition's constraints (tests/fargate/test_grading_integrity.py)."""
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))


def _grade(runner: Runner, task: Task, files: dict, commands: list[list[str]]) -> ExecutionResult:
    sample = Sample(task_id=task.task_id, sample_id="s", files=files, commands=commands)
    return score(task.grading, runner.run(task, sample))


def test_the_corpus_spans_every_class() -> None:
    assert len({h.name for h in HACKS}) == len(HACKS) >= 25
    kinds = Counter(h.kind for h in HACKS)
    assert set(kinds) == {
        "in-process", "file-layout", "agent-phase", "output-forging", "exits", "resources"
    }  # fmt: skip


def test_every_hack_scores_zero(backend: Runner) -> None:
    def run(hack: Hack) -> tuple[Hack, ExecutionResult]:
        return hack, _grade(backend, hack.task, hack.files, hack.commands)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, HACKS))
    escaped = [
        (hack.name, r.status.value, r.reward, r.loss_mask, r.flags, r.feedback[:300])
        for hack, r in results
        if r.reward != 0.0
        or r.loss_mask
        or (hack.violation and r.status != Status.INTEGRITY_VIOLATION)
    ]
    assert escaped == [], "\n".join(map(str, escaped))


def test_a_workspace_of_many_long_named_modules_grades_normally(backend: Runner) -> None:
    """Was a break: every top-level module name went to the grader in one environment
    variable, over the kernel's limit (E2BIG): a loss-masked sandbox_error for a policy that
    wrote 600 files."""
    files: dict[str, Any] = {f"m{i:04d}_{'x' * 240}.py": "" for i in range(600)}
    files["solution.py"] = "def add(x, y):\n    return x + y\n"
    result = _grade(backend, ADD, files, [])
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.error


def test_every_reference_scores_one_with_no_flag(backend: Runner) -> None:
    for task in TASKS:
        assert task.reference is not None
        result = _grade(backend, task, dict(task.reference), [])
        assert (result.status, result.reward, result.flags) == (Status.SUCCEEDED, 1.0, [])
