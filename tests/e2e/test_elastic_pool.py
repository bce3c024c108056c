"""An elastic twin: the stack's own scaler (functions/scaler, on the twin's schedule) sets the
pool's ECS desired count from the demand, and the twin's pool follows it within its maximum,
as ECS starts and stops tasks. A burst grows the pool from its minimum, every job ends with
exactly one result, and once idle the pool shrinks back to the minimum."""

from __future__ import annotations

import time
from typing import Any

from tests.support.tasks import CORRECT
from tests.support.twin import client_of, request
from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.models import Status

BURST = 12
JOB = [["sleep", "1"]]
MAX_WORKERS = 3
IDLE_S = 3.0


def _desired(twin: LocalTwin) -> int:
    ecs: Any = twin.client("ecs")
    answer = ecs.describe_services(
        cluster=twin.output(c.OUTPUT_CLUSTER), services=[twin.services.service]
    )
    return int(answer["services"][0]["desiredCount"])


def _wait(what: str, done: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_burst_grows_the_pool_and_idle_shrinks_it_to_the_minimum() -> None:
    with LocalTwin(workers=0, max_workers=MAX_WORKERS, scale_in_idle_s=IDLE_S) as twin:
        pool = twin.pool
        assert pool is not None
        # CloudFormation creates the service with one task; idle, the scaler takes it to 0.
        _wait("the idle pool never reached its minimum of 0", lambda: pool.size == 0, 60)
        _wait("the workers never stopped", lambda: not pool.pids(), 30)
        client = client_of(twin, BURST)
        handles = client.submit(
            [request(f"elastic-{n}", CORRECT, commands=JOB) for n in range(BURST)]
        )
        sizes: list[int] = []
        deadline = time.monotonic() + 240
        while not all(h.done() for h in handles):
            assert time.monotonic() < deadline, "the burst did not drain"
            sizes.append(len(pool.pids()))
            time.sleep(0.2)
        assert max(sizes) == MAX_WORKERS  # grown to the maximum, never past it
        results = [h.result(timeout=5) for h in handles]
        assert [r.status for r in results] == [Status.SUCCEEDED] * BURST
        assert sorted(r.request_id for r in results) == sorted(f"elastic-{n}" for n in range(BURST))
        # Exactly one result each, on its first attempt: no job lost to a worker stopping.
        assert [r.attempts for r in results] == [1] * BURST
        # Idle: back to the minimum, by the scaler's count and the pool's workers.
        _wait("the pool never shrank back", lambda: _desired(twin) == 0, 30 + 4 * IDLE_S)
        _wait("the idle workers never stopped", lambda: not pool.pids(), 30)
        # A worker that exited is counted by the pool's supervisor at its next look (every
        # SUPERVISE_S), after pids() stops listing it: seen, 2 of 3 counted at the check.
        _wait(
            "the stopped workers were never counted",
            lambda: pool.retired + pool.replaced >= MAX_WORKERS,
            10,
        )
        assert pool.replaced == 0  # no worker was lost: each one that stopped was retired
        assert pool.retired >= MAX_WORKERS
        client.close()
