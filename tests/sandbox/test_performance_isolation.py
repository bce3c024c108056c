"""The performance scorer's timed runs share nothing (issue 22): each starts from a pristine
workspace, memory charge, files and processes, and the Execute step's budget covers them all."""

from __future__ import annotations

import time
from typing import Any

from tests.support.performance_attacks import (
    BALLAST_COMMAND,
    CARRIES_RESULTS,
    LEAVES_BALLAST,
    MEMORY_HUNGRY_REFERENCE,
    REFERENCE,
    SLEEP_S,
    SLEEPS,
    grading_calls_workload_task,
    memory_task,
    perf_task,
    sleep_task,
)
from trialbox.models import ExecutionRequest, Sample, Status, Task
from trialbox.models.jobs import RolloutInput
from trialbox.models.result import ExecutionResult
from trialbox.pipeline.prepare import Preparer
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


def _grade(
    runner: Runner, task: Task, code: str, commands: list[list[str]] | None = None
) -> ExecutionResult:
    sample = Sample(
        task_id=task.task_id, sample_id="s", files={"solution.py": code}, commands=commands or []
    )
    return score(task.grading, runner.run(task, sample))


def test_a_solution_cannot_carry_its_results_from_one_timed_run_to_the_next(
    runner: Runner,
) -> None:
    result = _grade(runner, perf_task(), CARRIES_RESULTS)
    assert result.status == Status.SUCCEEDED
    # Each run computes afresh: several times the reference's CPU, as honestly slow.
    assert result.reward is not None and result.reward < 0.6, result.reward_breakdown
    assert result.reward_breakdown["cpu_s"] > 2 * result.reward_breakdown["reference_cpu_s"]


def test_a_solution_cannot_carry_its_results_from_grading_to_its_timed_runs(
    runner: Runner,
) -> None:
    """Its files are set aside before grading runs any of its code."""
    result = _grade(runner, grading_calls_workload_task(), CARRIES_RESULTS)
    assert (result.status, result.tests_passed) == (Status.SUCCEEDED, 2)
    assert result.reward is not None and result.reward < 0.6, result.reward_breakdown


def test_files_a_timed_run_leaves_never_push_the_reference_out_of_memory(
    runner: Runner,
) -> None:
    task = memory_task()
    assert _grade(runner, task, MEMORY_HUNGRY_REFERENCE).reward == 1.0  # it fits, alone
    result = _grade(runner, task, LEAVES_BALLAST)
    # Never the platform's failure, with its loss mask: the reference ran in a fresh cgroup.
    assert (result.status, result.loss_mask, result.error) == (Status.SUCCEEDED, False, None)
    assert result.reward is not None and result.reward > 0, result.reward_breakdown


def test_files_an_agent_command_leaves_never_push_the_reference_out_of_memory(
    runner: Runner,
) -> None:
    result = _grade(runner, memory_task(), REFERENCE, [BALLAST_COMMAND])
    assert (result.status, result.loss_mask, result.error) == (Status.SUCCEEDED, False, None)
    assert result.reward is not None and result.reward > 0, result.reward_breakdown


class _Jobs:
    """Where Prepare writes the job: only its answer matters here."""

    def put_json(self, key: str, value: Any) -> str:
        return f"s3://jobs/{key}"


def _execute_budget_s(task: Task, commands: list[list[str]]) -> float:
    """What Prepare gives the runner within the Execute step, without its wait and margin."""
    heartbeat_s, margin_s = 30, 60
    preparer = Preparer(tasksets=None, jobs=_Jobs(), heartbeat_s=heartbeat_s, margin_s=margin_s)  # type: ignore[arg-type]
    request = ExecutionRequest.model_validate(
        {"request_id": "r-budget", "task": task.model_dump(mode="json"), "commands": commands}
    )
    ref = preparer(RolloutInput(request_id="r-budget", request=request))
    return ref.timeout_s - heartbeat_s - margin_s


def test_the_execute_budget_covers_a_solution_that_sleeps_through_its_timed_runs(
    runner: Runner,
) -> None:
    task = sleep_task()
    started = time.monotonic()
    result = _grade(runner, task, SLEEPS)
    wall = time.monotonic() - started
    # Sleeping costs no CPU: its speed factor stays 1, but every timed run takes its time.
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.reward_breakdown
    assert wall > 3 * SLEEP_S
    assert wall < _execute_budget_s(task, []), wall
