"""A run stopped from outside (its request cancelled, or its claim taken over: the worker sets
the run's `stop`) is killed where it is, on both backends: the running command dies at once,
nothing after it starts (no further command, no grading), and the report is a `sandbox_error`
that says it was stopped. Without it, a cancelled sample ran on to its own deadline."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Sample, Status, Task
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def runner(request: pytest.FixtureRequest) -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": request.param}))


def test_a_stopped_run_is_killed_at_once_and_runs_nothing_after(runner: Runner) -> None:
    task = Task.model_validate(ADD_TASK | {"limits": {"timeout_s": 60, "memory_mb": 512}})
    commands = [["sleep", "60"], ["touch", "after"]]
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT},
                    commands=commands)  # fmt: skip
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    report = runner.run(task, sample, stop=stop)
    assert time.monotonic() - started < 10
    assert report.status == Status.SANDBOX_ERROR, report
    assert report.error and "stopped" in report.error, report.error
    assert report.grading is None and len(report.commands) <= 1, report


def test_a_run_never_stopped_is_unchanged(runner: Runner) -> None:
    task = Task.model_validate(ADD_TASK)
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT})
    report = runner.run(task, sample, stop=threading.Event())
    assert report.status == Status.SUCCEEDED and report.grading is not None, report
