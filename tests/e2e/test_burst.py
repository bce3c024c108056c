"""A burst larger than the pool: the backlog waits in the requests queue, not in Step Functions,
so no job's lost-sandbox clock runs while it waits for a worker (trialbox.pipeline.admission).

The twin's heartbeat here is 10 s and the burst takes about five heartbeats to drain: every job
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
from trialbox.models import Status
from trialbox.sdk import Client, Resources

HEARTBEAT_S = 10  # the twin's least that a loaded test machine still beats in time
BURST = 40
JOB = [["sleep", "2"]]  # with grading, about 2.5 s a job: 40 on 2 workers take ~50 s


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


def test_a_burst_waits_in_the_requests_queue_and_only_a_killed_workers_job_retries() -> None:
    """BURST jobs sent at once by two clients to 2 workers; one worker SIGKILLed mid-burst.
    Every job that waited for a worker ends on its first attempt; the one the killed worker
    held is retried within 3 heartbeats of the kill (the replacement worker, or the other)."""
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        assert twin.pool is not None
        clients = [_client(twin), _client(twin)]
        started = time.monotonic()
        handles = []
        for number in range(BURST):
            sample = request(f"burst-{number}", CORRECT, commands=JOB)
            handles += clients[number % 2].submit([sample])
        time.sleep(3 * HEARTBEAT_S)  # three heartbeats into the burst: jobs have waited
        os.kill(twin.pool.pids()[0], signal.SIGKILL)
        killed_at = time.time()
        results = [handle.result(timeout=300) for handle in handles]
        took = time.monotonic() - started
    assert took > 4 * HEARTBEAT_S  # the burst did outlast the heartbeat many times over
    assert [(r.status, r.reward) for r in results] == [(Status.SUCCEEDED, 1.0)] * BURST
    retried = [r for r in results if r.attempts > 1]
    assert len(retried) <= 1  # the killed worker's job, if it held one: never a waiting one
    for result in retried:
        assert result.attempts == 2
        assert result.timings is not None and result.timings.started_at is not None
        assert result.timings.started_at - killed_at < 3 * HEARTBEAT_S
