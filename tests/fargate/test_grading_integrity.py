"""The grading boundary on the AWS path: the red-team corpus and all 164 HumanEval canonical
solutions as real jobs through the worker as the task definition runs it (rlimit backend, the
task's capabilities), as tests/redteam and tests/sandbox/test_humaneval.py do on the host."""

from __future__ import annotations

import uuid
from typing import Any

from tests.fargate.harness import Service
from tests.fargate.submit import run_jobs
from tests.redteam.hacks import HACKS
from trialbox.models import ExecutionRequest, Status, Task
from trialbox.qc import humaneval
from trialbox.sdk import Client


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


def test_every_hack_scores_zero_on_the_worker(client: Client, service: Service) -> None:
    results = run_jobs(
        client, service, [_job(h.task, h.files, h.commands) for h in HACKS], timeout=600
    )
    escaped = [
        (hack.name, r.status.value, r.reward, r.loss_mask, r.flags, r.feedback[:300])
        for hack, r in zip(HACKS, results, strict=True)
        if r.reward != 0.0
        or r.loss_mask
        or (hack.violation and r.status != Status.INTEGRITY_VIOLATION)
    ]
    assert escaped == [], "\n".join(map(str, escaped))


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
