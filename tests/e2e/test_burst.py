"""A burst larger than the pool: the backlog waits in the requests queue, not in Step Functions,
so no job's lost-sandbox clock runs while it waits for a worker (trialbox.pipeline.admission).

The twin's heartbeat here is 5 s and the burst takes about six heartbeats to drain: every job
that waited for a worker in the work queue would be retried as a lost sandbox (attempts > 1)
and, after three tries, end a masked `sandbox_error`. The clients send everything at once
(`concurrency` above the burst), as several trainers do: admission is the stack's."""

from __future__ import annotations

import os
import signal
import time

import boto3

from tests.support.tasks import CORRECT
from tests.support.twin import request
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionResult, Status
from trialbox.sdk import Client, Resources

HEARTBEAT_S = 5
BURST = 40
JOB = [["sleep", "1"]]  # with grading, about 1.5 s a job: 40 on 2 workers take ~30 s


def _client(twin: LocalTwin) -> Client:
    session = boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    return Client(
        Resources.from_outputs(twin.outputs),
        endpoint_url=twin.endpoint_url,
        session=session,
        concurrency=10 * BURST,
    )


def _burst(twin: LocalTwin, prefix: str) -> list[ExecutionResult]:
    """BURST samples sent at once by two clients."""
    clients = [_client(twin), _client(twin)]
    handles = []
    for number in range(BURST):
        sample = request(f"{prefix}-{number}", CORRECT, commands=JOB)
        handles += clients[number % 2].submit([sample])
    return [handle.result(timeout=300) for handle in handles]


def test_a_burst_past_the_pool_waits_in_the_requests_queue_and_no_job_is_retried() -> None:
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        started = time.monotonic()
        results = _burst(twin, "burst")
        took = time.monotonic() - started
    assert took > 4 * HEARTBEAT_S  # the burst did outlast the heartbeat many times over
    assert [(r.status, r.reward, r.attempts) for r in results] == [
        (Status.SUCCEEDED, 1.0, 1)
    ] * BURST


def test_a_worker_killed_during_a_burst_has_its_job_retried_within_three_heartbeats() -> None:
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        assert twin.pool is not None
        clients = [_client(twin), _client(twin)]
        handles = []
        for number in range(BURST // 2):
            sample = request(f"kill-{number}", CORRECT, commands=JOB)
            handles += clients[number % 2].submit([sample])
        time.sleep(6)  # the burst is running on both workers
        victim = twin.pool.pids()[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        results = [handle.result(timeout=300) for handle in handles]
    assert {r.status for r in results} == {Status.SUCCEEDED}
    retried = [r for r in results if r.attempts > 1]
    # The job the worker held (at most one: a worker takes one job at a time).
    assert len(retried) <= 1
    for result in retried:
        assert result.timings is not None and result.timings.started_at is not None
        assert result.timings.started_at - killed_at < 3 * HEARTBEAT_S
