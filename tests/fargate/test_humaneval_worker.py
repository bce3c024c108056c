"""All 164 HumanEval canonical solutions as real jobs through the worker as the task definition
runs it (rlimit backend, the task's capabilities), as tests/sandbox/test_humaneval.py runs them
on the host: every one scores 1.0 with no flag."""

from __future__ import annotations

from tests.fargate.harness import Service
from tests.fargate.submit import graded_job, run_jobs
from trialbox.models import Status, Task
from trialbox.qc import humaneval
from trialbox.sdk import Client


def test_every_humaneval_canonical_solution_scores_one_on_the_worker(
    client: Client, service: Service
) -> None:
    tasks = [Task.model_validate(t) for t in humaneval.tasks()]
    jobs = [graded_job(t, dict(t.reference or {}), []) for t in tasks]
    results = run_jobs(client, service, jobs, timeout=900)
    wrong = [
        (task.task_id, r.status.value, r.reward, r.flags, r.feedback[:300])
        for task, r in zip(tasks, results, strict=True)
        if (r.status, r.reward, r.flags) != (Status.SUCCEEDED, 1.0, [])
    ]
    assert wrong == [], "\n".join(map(str, wrong))
