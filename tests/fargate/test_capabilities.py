"""Every capability the task keeps is needed: without any one of them, a job fails (a
sandbox_error, a wrong result, or leftovers reaching the next job). And the template asks
Fargate only for what it accepts."""

from __future__ import annotations

import pytest

from tests.fargate.harness import Harness
from tests.fargate.nsinit import CAPS
from tests.fargate.programs import LEAVE_BEHIND, PROBE
from tests.fargate.submit import WorkerCrashed, python, request, run_jobs
from tests.fargate.taskdef import DEFAULT_CAPABILITIES, FARGATE_ADDABLE, Container, worker_container
from tests.support.tasks import CORRECT
from trialbox.local.template import load_template
from trialbox.models import Status
from trialbox.sdk import Client


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kept" in metafunc.fixturenames:
        kept = sorted(worker_container(load_template()).capabilities)
        metafunc.parametrize("kept", kept)


def test_add_is_within_what_fargate_accepts(container: Container) -> None:
    assert container.add <= FARGATE_ADDABLE


def test_drop_covers_every_default_not_kept(container: Container) -> None:
    assert container.drop <= set(CAPS) | {"ALL"}  # names ECS knows, spelled without CAP_
    assert (
        "ALL" in container.drop or DEFAULT_CAPABILITIES - container.capabilities <= container.drop
    )
    assert container.capabilities <= DEFAULT_CAPABILITIES | FARGATE_ADDABLE


def test_a_job_fails_without(kept: str, client: Client, harness: Harness) -> None:
    service = harness.service({"TRIALBOX_SANDBOX_SLOTS": "1"}, frozenset({kept}))
    problems: list[str] = []
    try:
        jobs = [
            request(files={"solution.py": CORRECT}, grade=True),
            request(commands=[python(LEAVE_BEHIND)]),
            request(commands=[python(PROBE)]),
        ]
        for job in jobs:
            if problems or service.failures():
                break
            try:
                (result,) = run_jobs(client, service, [job], timeout=60)
            except WorkerCrashed:
                break  # service.failures() says why
            if result.status != Status.SUCCEEDED:
                problems.append(f"{result.status.value}: {result.error}")
            elif job.grade and result.reward != 1.0:
                problems.append(f"a correct sample got {result.reward}: {result.feedback[:300]}")
            elif job is jobs[-1] and result.commands[0].stdout != "nothing found\n":
                problems.append(f"leftovers reached the next job: {result.commands[0].stdout}")
        problems += service.failures()
    finally:
        service.stop()
    assert problems, f"every job went right without CAP_{kept}: the task need not keep it"
