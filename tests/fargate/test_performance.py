"""The performance scorer's timed runs on the worker, as the task definition runs it (rlimit
backend: no private /tmp or /dev/shm, no cgroup), as jobs through the twin's pipeline (issue
22): each timed run starts pristine, a reference run is never blamed for what the solution left,
and the Execute step's budget covers every run, so no job needs a second attempt."""

from __future__ import annotations

import uuid
from typing import Any

from tests.fargate.harness import Service
from tests.fargate.submit import run_jobs
from tests.support.performance_attacks import (
    BALLAST_COMMAND,
    CARRIES_RESULTS,
    LEAVES_BALLAST,
    REFERENCE,
    SLEEPS,
    grading_calls_workload_task,
    memory_task,
    perf_task,
    sleep_task,
)
from trialbox.models import ExecutionRequest, Status, Task
from trialbox.sdk import Client


def _job(task: Task, code: str, commands: list[list[str]] | None = None) -> ExecutionRequest:
    body: dict[str, Any] = {
        "request_id": f"fg-perf-{uuid.uuid4().hex[:12]}",
        "task": task.model_dump(mode="json", exclude_none=True),
        "files": {"solution.py": code},
        "commands": commands or [],
        "grade": True,
    }
    return ExecutionRequest.model_validate(body)


def test_timed_runs_share_nothing_on_the_worker(client: Client, service: Service) -> None:
    carries, from_grading, ballast, agent_ballast, sleeps = run_jobs(
        client,
        service,
        [
            _job(perf_task(), CARRIES_RESULTS),
            _job(grading_calls_workload_task(), CARRIES_RESULTS),
            _job(memory_task(), LEAVES_BALLAST),
            _job(memory_task(), REFERENCE, [BALLAST_COMMAND]),
            _job(sleep_task(), SLEEPS),
        ],
        timeout=300,
    )
    # Its cache (in the workspace, HOME, TMPDIR, /tmp or /dev/shm) is gone before each run.
    # Nor what its process left in the workspace at grading.
    for result in (carries, from_grading):
        assert result.status == Status.SUCCEEDED, result.error
        assert result.reward is not None and result.reward < 0.6, result.reward_breakdown
    for result in (ballast, agent_ballast):
        assert (result.status, result.loss_mask, result.error) == (Status.SUCCEEDED, False, None)
    assert (sleeps.status, sleeps.reward) == (Status.SUCCEEDED, 1.0), sleeps.error
    # Within its Execute step: never a timed-out attempt and a retry.
    results = (carries, from_grading, ballast, agent_ballast, sleeps)
    assert [r.attempts for r in results] == [1] * len(results)
    assert service.failures() == []
