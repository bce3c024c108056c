"""A call that runs its whole worker out of memory is the policy's `oom`, scored; a worker
lost for another reason is a masked `sandbox_error`. The twin's workers are ECS tasks in its
moto, each in a memory cgroup (trialbox.local.tasks); the SDK asks ECS why a lost worker
stopped, as it does on AWS."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.support.tasks import ADD_TASK
from tests.support.twin import LOST_WORKER_HEARTBEAT_S, twin_and_client
from trialbox.local.tasks import OOM_REASON
from trialbox.local.twin import LocalTwin
from trialbox.models import Status, Task
from trialbox.sdk import Client

WORKER_MEMORY_MB = 200  # the twin worker's cgroup: well over what a worker holds idle (~70 MiB)
TASK = Task.model_validate(ADD_TASK | {"limits": {"memory_mb": 1024, "disk_mb": 400}})
# 240 MiB that does not compress: the worker builds the call's checkpoint in its own memory.
BLOB = ["sh", "-c", "head -c 240M /dev/urandom > blob && echo written"]


@pytest.fixture(scope="module")
def small() -> Iterator[tuple[LocalTwin, Client]]:
    with twin_and_client(
        workers=1, worker_memory_mb=WORKER_MEMORY_MB, heartbeat_s=LOST_WORKER_HEARTBEAT_S
    ) as both:
        yield both


@pytest.fixture(scope="module")
def killable() -> Iterator[tuple[LocalTwin, Client]]:
    """Workers with the task definition's memory."""
    with twin_and_client(workers=2, heartbeat_s=LOST_WORKER_HEARTBEAT_S) as both:
        yield both


def test_a_call_that_runs_its_worker_out_of_memory_is_the_policys_oom(
    small: tuple[LocalTwin, Client],
) -> None:
    twin, client = small
    assert twin.pool is not None
    with client.session(TASK, ttl_s=300) as s:
        assert s.exec(["sh", "-c", "echo kept > kept.txt"]).status == Status.SUCCEEDED
        hog = s.exec(BLOB)
        assert (hog.status, hog.loss_mask) == (Status.OOM, False), hog
        assert "out of memory" in hog.feedback
        assert OOM_REASON in twin.pool.reasons
        # The session goes on, from the state before the call, on the replacement worker.
        after = s.step(commands=[["sh", "-c", "cat kept.txt; ls"]])
        assert after.status == Status.SUCCEEDED
        assert after.commands[0].stdout.split() == ["kept", "kept.txt", "solution.py"]


def test_a_worker_killed_from_outside_is_a_masked_sandbox_error(
    killable: tuple[LocalTwin, Client],
) -> None:
    twin, client = killable
    assert twin.pool is not None
    with client.session(TASK, ttl_s=300) as s:
        s.exec(["true"])
        threading.Timer(1.5, twin.pool.kill).start()
        lost = s.exec(["sleep", "30"])
        assert (lost.status, lost.loss_mask) == (Status.SANDBOX_ERROR, True), lost
        assert "exit code 137" in (lost.error or "")
        assert s.exec(["true"]).status == Status.SUCCEEDED
