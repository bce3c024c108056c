"""The grading boundary on both backends: the red-team corpus (tests/redteam/hacks.py) and the
hostile corpus (tests/redteam/corpus.py) on bwrap, as tests/redteam runs them, and as real jobs
through the worker as the task definition runs it (rlimit backend, the task's capabilities);
and all 164 HumanEval canonical solutions on the worker, as tests/sandbox/test_humaneval.py
runs them on the host."""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.fargate.harness import Harness, Service
from tests.fargate.submit import run_jobs
from tests.redteam.corpus import HOSTILE, Hostile, result_summary
from tests.redteam.hacks import HACKS, Hack
from trialbox.models import ExecutionRequest, ExecutionResult, Sample, Status, Task
from trialbox.qc import humaneval
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score
from trialbox.sdk import Client

ROWS: list[Hack | Hostile] = [*HACKS, *HOSTILE]
# Jobs queued at once. The worker runs one job at a time, and a job that waits for a worker
# longer than a heartbeat (the twin's: 60 s) times out as on AWS: the rows' outcomes, not the
# queue, are under test.
WAVE = 4


class DeclaredOutcomes(UserWarning):
    """Carries the table to the log: under xdist a passing test's output is not shown, its
    warnings are (the warnings summary)."""


def _job(task: Task, files: dict[str, Any], commands: list[list[str]]) -> ExecutionRequest:
    return ExecutionRequest.model_validate(
        {
            "request_id": f"fg-{uuid.uuid4().hex[:12]}",
            "task": task.model_dump(mode="json", exclude_none=True),
            "files": files,
            "commands": commands,
            "grade": True,
        }
    )


def _on_bwrap(rows: list[Hack | Hostile]) -> list[ExecutionResult]:
    runner = Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))

    def grade(row: Hack | Hostile) -> ExecutionResult:
        sample = Sample(
            task_id=row.task.task_id, sample_id=row.name, files=row.files, commands=row.commands
        )
        return score(row.task.grading, runner.run(row.task, sample))

    # One at a time, as the worker runs its jobs: the worker's side is the longer anyway, and
    # the rows' 5 s limits are wall-clock limits that an overloaded machine turns into timeouts.
    return [grade(row) for row in rows]


def table(
    rows: list[Hack | Hostile], bwrap: list[ExecutionResult], rlimit: list[ExecutionResult]
) -> str:
    lines = [f"{'row':<38} {'declared':<34} {'bwrap':<28} rlimit"]
    for row, on_bwrap, on_rlimit in zip(rows, bwrap, rlimit, strict=True):
        cells = [str(row.expect)]
        for result in (on_bwrap, on_rlimit):
            mark = "" if row.expect.matches(result) else " !"
            cells.append(result_summary(result) + mark)
        lines.append(f"{row.name:<38} {cells[0]:<34} {cells[1]:<28} {cells[2]}")
    return "\n".join(lines)


@pytest.fixture
def fresh_worker(harness: Harness) -> Iterator[Service]:
    """A worker of its own: a row that wedges or dirties one harms no later test."""
    running = harness.service()
    try:
        yield running
    finally:
        with contextlib.suppress(AssertionError):  # a wedged worker is killed, then this
            running.stop()


def test_both_corpora_get_their_declared_outcome_on_both_backends(
    client: Client, fresh_worker: Service
) -> None:
    jobs = [_job(row.task, row.files, row.commands) for row in ROWS]
    with ThreadPoolExecutor(1) as pool:  # both backends at once
        bwrap = pool.submit(_on_bwrap, ROWS)
        rlimit = [
            result
            for start in range(0, len(jobs), WAVE)
            for result in run_jobs(client, fresh_worker, jobs[start : start + WAVE], timeout=120)
        ]
        on_bwrap = bwrap.result()
    shown = table(ROWS, on_bwrap, rlimit)
    print(shown)
    warnings.warn(DeclaredOutcomes("\n" + shown), stacklevel=1)
    wrong = [
        (row.name, backend, result.status.value, result.feedback[:300], result.error)
        for row, *pair in zip(ROWS, on_bwrap, rlimit, strict=True)
        for backend, result in zip(("bwrap", "rlimit"), pair, strict=True)
        if not row.expect.matches(result)
    ]
    assert wrong == [], shown + "\n\n" + "\n".join(map(str, wrong))
    assert fresh_worker.failures() == []  # no container ran out of memory or crashed


def test_every_humaneval_canonical_solution_scores_one_on_the_worker(
    client: Client, service: Service
) -> None:
    tasks = [Task.model_validate(t) for t in humaneval.tasks()]
    jobs = [_job(t, dict(t.reference or {}), []) for t in tasks]
    results = run_jobs(client, service, jobs, timeout=900)
    wrong = [
        (task.task_id, r.status.value, r.reward, r.flags, r.feedback[:300])
        for task, r in zip(tasks, results, strict=True)
        if (r.status, r.reward, r.flags) != (Status.SUCCEEDED, 1.0, [])
    ]
    assert wrong == [], "\n".join(map(str, wrong))
