"""What one job leaves on a worker never reaches the next job on the same worker: one slot
(TRIALBOX_SANDBOX_SLOTS=1, test-only) so the next job even runs as the same uid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fargate.harness import Harness, Service
from tests.fargate.programs import LEAVE_BEHIND, PROBE
from tests.fargate.submit import describe, python, request, run_jobs
from tests.support.programs import STOPPED_VFORK_PAIR
from trialbox import constants as c
from trialbox.models import ExecutionResult, Status
from trialbox.sdk import Client

ONE_SLOT = {"TRIALBOX_SANDBOX_SLOTS": "1"}


def leave_then_probe(client: Client, service: Service) -> tuple[ExecutionResult, ExecutionResult]:
    (left,) = run_jobs(client, service, [request(commands=[python(LEAVE_BEHIND)])])
    (probe,) = run_jobs(client, service, [request(commands=[python(PROBE)])])
    return left, probe


def reuse_expected(harness: Harness) -> bool | None:
    """The task runs more than one job (the template's recycle setting), or not; None when
    the template does not say."""
    value = harness.template_env.get(c.ENV_RECYCLE_AFTER_JOBS)
    return None if value is None else int(value) >= 2


@pytest.fixture(scope="module")
def one_slot(harness: Harness) -> Iterator[Service]:
    running = harness.service(ONE_SLOT)
    try:
        yield running
    finally:
        running.stop()


def test_next_job_on_the_worker_finds_nothing(
    client: Client, one_slot: Service, harness: Harness
) -> None:
    left, probe = leave_then_probe(client, one_slot)
    assert left.status == Status.SUCCEEDED, describe(left)
    assert left.commands[0].stdout.startswith("left: ") and "daemon" in left.commands[0].stdout
    assert probe.status == Status.SUCCEEDED, describe(probe)
    assert probe.commands[0].stdout == "nothing found\n", left.commands[0].stdout
    ran = [one_slot.run_at(r.timings.started_at or 0) for r in (left, probe)]
    reuse = reuse_expected(harness)
    if reuse is not None:  # reuse: the wipe, not a fresh task, cleared it
        assert (ran[0] == ran[1]) is reuse, (ran, one_slot.logs())
    assert one_slot.failures() == []


def test_a_stopped_vfork_pair_leaves_the_slot_usable(
    client: Client, one_slot: Service, harness: Harness
) -> None:
    """Was a break: the pair (a vfork parent in D on its stopped child) could not be stopped,
    so it was never killed: the job was `sandbox_error`, the pair outlived it, and every later
    sweep of the slot failed. Now it is the job's timeout, and the same slot's next job runs."""
    pair = request(commands=[python(STOPPED_VFORK_PAIR)], timeout_s=2)
    (left,) = run_jobs(client, one_slot, [pair])
    assert (left.status, left.commands[0].stdout) == (Status.TIMEOUT, "pair\n"), describe(left)
    assert harness.lasting_processes() == []
    (probe,) = run_jobs(client, one_slot, [request(commands=[python(PROBE)])])
    assert probe.status == Status.SUCCEEDED, describe(probe)
    assert probe.commands[0].stdout == "nothing found\n", describe(probe)
    ran = [one_slot.run_at(r.timings.started_at or 0) for r in (left, probe)]
    if reuse_expected(harness):  # the same worker swept the slot and took the next job
        assert ran[0] == ran[1], (ran, one_slot.logs())
    assert one_slot.failures() == []
