"""The red-team corpus (tests/redteam/hacks.py) and the hostile corpus (corpus.py): their
shape and declared outcomes here; both corpora run on bwrap and on the worker against those
declarations in tests/fargate/test_grading_integrity.py. Every reference scores 1.0 with no
flag, and a workspace of many long names grades normally, on bwrap."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.redteam.corpus import HOSTILE, OVERRUN_S, ROOM_S, Hostile
from tests.redteam.hacks import ADD, HACKS, TASKS, Hack
from trialbox.models import Sample, Status, Task
from trialbox.models.result import ExecutionResult, reward_for
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


@pytest.fixture(scope="module")
def backend() -> Runner:
    """bwrap here; the rlimit backend runs the same cases as jobs through the worker under the
    task definition's constraints (tests/fargate/test_grading_integrity.py)."""
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))


def _grade(
    runner: Runner, task: Task, files: dict[str, Any], commands: list[list[str]]
) -> ExecutionResult:
    sample = Sample(task_id=task.task_id, sample_id="s", files=files, commands=commands)
    return score(task.grading, runner.run(task, sample))


def test_the_corpus_spans_every_class() -> None:
    assert len({h.name for h in HACKS}) == len(HACKS) >= 25
    kinds = Counter(h.kind for h in HACKS)
    assert set(kinds) >= {
        "in-process", "file-layout", "agent-phase", "output-forging", "exits", "resources"
    }  # fmt: skip


def test_every_row_declares_an_unmasked_outcome_the_reward_table_allows() -> None:
    """The declared values the backends are held to (tests/fargate/test_grading_integrity.py
    runs both corpora on bwrap and on the worker): each is a row of the reward table, and none
    is masked, since a policy that can turn a hostile sample into a masked failure escapes its
    negative reward."""
    rows: list[Hack | Hostile] = [*HACKS, *HOSTILE]
    assert len({r.name for r in rows}) == len(rows)
    wrong = [
        (r.name, str(r.expect))
        for r in rows
        if r.expect.loss_mask
        or any(
            reward_for(status, r.expect.reward) != (r.expect.reward, r.expect.loss_mask)
            for status in r.expect.statuses
        )
    ]
    assert wrong == []
    assert {r.expect.status for r in HACKS} >= {Status.INTEGRITY_VIOLATION, Status.TIMEOUT}
    assert {r.expect.status for r in HOSTILE} == {Status.SUCCEEDED, Status.TIMEOUT, Status.OOM}


def test_every_row_gives_its_declared_outcome_a_wide_margin() -> None:
    """On a loaded machine a wall limit is what gives first, so no outcome may hang on one: a
    row declared to overrun its time never ends and is graded within OVERRUN_S, every other
    row has ROOM_S to finish or reach its memory limit. Agent commands stop at OVERRUN_S: what
    they do leaves the grading's status alone. (The performance scorer's rows are sized by
    their own limits, which their attacks are about.)"""
    rows: list[Hack | Hostile] = [*HACKS, *HOSTILE]
    wrong = [
        (r.name, str(r.expect), r.task.limits.timeout_s, r.task.grading_timeout_s)
        for r in rows
        if r.task.grading.performance is None
        and (
            r.task.limits.timeout_s != OVERRUN_S
            or r.task.grading_timeout_s
            != (OVERRUN_S if r.expect.statuses == (Status.TIMEOUT,) else ROOM_S)
        )
    ]
    assert wrong == []


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
