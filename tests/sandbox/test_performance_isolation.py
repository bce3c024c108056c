"""The performance scorer's timed runs share nothing (issue 22): each starts from a pristine
workspace, memory charge, files and processes, and the Execute step's budget covers them all."""

from __future__ import annotations

import time
from typing import Any

import pytest

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
from trialbox.sandbox import fs
from trialbox.sandbox import runner as runner_module
from trialbox.sandbox.config import SandboxConfig
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


# An agent command fills the workspace up to `names` entries (or until it is full: ENOSPC),
# in one directory `depth` levels down: the deepest a copy walks (fs.MAX_DEPTH). Files, or
# hard links to a few files (each copied as a link to its first copy). Several such commands
# fill it in turns, each adding to what the last left.
FILL = (
    "import errno, os, sys\n"
    "names, depth, links = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == 'links'\n"
    "path = os.path.join(*['d'] * depth)\n"
    "os.makedirs(path, exist_ok=True)\n"
    "have = sum(len(dirs) + len(files) for _, dirs, files in os.walk('.'))\n"
    "fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)\n"
    "try:\n"
    "    while have < names:\n"
    "        if links:  # a file takes 65,000 names at most on ext4\n"
    "            first = f'f{have // 30000}'\n"
    "            try:\n"
    "                os.link(first, str(have), src_dir_fd=fd, dst_dir_fd=fd)\n"
    "            except FileNotFoundError:\n"
    "                os.close(os.open(first, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))\n"
    "        else:\n"
    "            os.close(os.open(str(have), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))\n"
    "        have += 1\n"
    "except OSError as exc:\n"
    "    if exc.errno != errno.ENOSPC:\n"
    "        raise\n"
    "print(have)\n"
)


@pytest.fixture(scope="module")
def rlimit() -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "rlimit"}))


def _backend(request: pytest.FixtureRequest, backend: str) -> Runner:
    runner: Runner = request.getfixturevalue("runner" if backend == "bwrap" else "rlimit")
    return runner


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_every_copy_a_job_makes_is_held_to_the_deadline_the_budget_counts(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prepare's budget counts each copy of a workspace at copy_s (test_steps); the runner holds
    every copy to that same deadline, so a job's copies never outlast what the budget gives
    them (at the entry bound, 65,535 hard links 63 deep take 3.4 s idle and 18 s at load 11:
    benchmarks/copy_bound.py). Here the deadline is cut to nothing: a copy that cannot finish
    in it is the policy's ungradable workspace, scored 0 and never masked."""
    monkeypatch.setattr(runner_module, "copy_s", lambda disk_mb: 0.0)
    task = perf_task(repeats=3, limits={"timeout_s": 10, "memory_mb": 256})
    commands = [["python", "-c", FILL, "2000", "8", "files"]]
    result = _grade(_backend(request, backend), task, REFERENCE, commands)
    assert (result.status, result.loss_mask, result.error) == (Status.SUCCEEDED, False, None)
    assert (result.tests_passed, result.reward) == (0, 0.0)
    assert "took more than 0 s to copy" in result.feedback, result.feedback


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_a_workspace_never_holds_more_entries_than_its_bound_on_either_backend(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """bwrap's tmpfs refuses the entry past the bound; the rlimit backend's plain directory
    takes it, and then its copy refuses it: the policy's ungradable workspace, scored 0 and
    never masked."""
    task = perf_task(repeats=3, limits={"timeout_s": 10, "memory_mb": 256})
    commands = [["python", "-c", FILL, str(fs.WORKSPACE_INODES + 1), "1", "files"]]
    result = _grade(_backend(request, backend), task, REFERENCE, commands)
    made = int(result.commands[0].stdout)
    assert (result.status, result.loss_mask, result.error) == (Status.SUCCEEDED, False, None)
    if backend == "bwrap":
        assert made == fs.WORKSPACE_INODES - 1
        assert result.tests_passed == 1 and result.reward is not None and result.reward > 0
    else:
        assert made == fs.WORKSPACE_INODES + 1
        assert (result.tests_passed, result.reward) == (0, 0.0)
        assert f"more than {fs.WORKSPACE_INODES} files and directories" in result.feedback
