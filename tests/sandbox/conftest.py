"""Real bubblewrap sandboxes: these tests need root, bwrap and the runtime from `make setup`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.sandbox import Exec, Grade
from tests.support.tasks import ADD_TASK
from trialbox.models import Limits, Sample, Task
from trialbox.models.report import CommandResult, RunReport
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


@pytest.fixture(scope="session")
def runner() -> Runner:
    return Runner()


@pytest.fixture(scope="module")
def rlimit() -> Runner:
    """The rlimit backend (Fargate's), beside the machine's default."""
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "rlimit"}))


@pytest.fixture(scope="module")
def bwrap() -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))


@pytest.fixture
def run_exec(runner: Runner) -> Exec:
    def run(code: str, **limits: Any) -> CommandResult:
        return runner.exec(["python", "-c", code], Limits(**limits))

    return run


@pytest.fixture
def grade(runner: Runner) -> Grade:
    def run(
        files: dict[str, Any],
        commands: list[list[str]] | None = None,
        isolation: str | None = None,
        **task_changes: Any,
    ) -> tuple[RunReport, ExecutionResult]:
        """`isolation="in_process"`: the guards for tasks that import the solution in pytest."""
        raw = json.loads(json.dumps(ADD_TASK)) | task_changes
        if isolation is not None:
            raw["grading"] = raw["grading"] | {"isolation": isolation}
        task = Task.model_validate(raw)
        sample = Sample(task_id=task.task_id, sample_id="s", files=files, commands=commands or [])
        report = runner.run(task, sample)
        return report, score(task.grading, report)

    return run
