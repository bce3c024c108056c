"""A burst larger than the pool: the backlog waits in the requests queue, not in Step Functions,
so no job's lost-sandbox clock runs while it waits for a worker (trialbox.pipeline.admission).

The twin's heartbeat here is 10 s and the burst takes about five heartbeats to drain: every job
that waited for a worker in the work queue would be retried as a lost sandbox (attempts > 1)
and, after three tries, end a masked `sandbox_error`. The clients send everything at once
(`concurrency` above the burst), as several trainers do: admission is the stack's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.processes import descendants
from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import client_of, request
from trialbox.local import principals
from trialbox.local.requestlog import ENV_REQUEST_LOG
from trialbox.local.twin import LocalTwin
from trialbox.models import Status

HEARTBEAT_S = 10  # the twin's least that a loaded test machine still beats in time
BURST = 40
JOB = [["sleep", "2"]]  # with grading, about 2.5 s a job: 40 on 2 workers take ~50 s


def test_a_burst_waits_in_the_requests_queue_and_only_a_killed_workers_job_retries() -> None:
    """BURST jobs sent at once by two clients to 2 workers; one worker SIGKILLed mid-burst.
    Every job that waited for a worker ends on its first attempt; the one the killed worker
    held is retried within 3 heartbeats of the kill (the replacement worker, or the other)."""
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        assert twin.pool is not None
        clients = [client_of(twin, 10 * BURST), client_of(twin, 10 * BURST)]
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


def test_a_job_admitted_on_capacity_that_is_then_lost_waits_without_a_lost_sandbox_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break (red team 23, #2): a job admitted against a worker that stops answering
    before it takes it waits in the work queue while the other worker runs a job longer than
    three heartbeats. Each lapse of the Execute step's heartbeat was counted as a lost sandbox:
    after three, a masked `sandbox_error` for a job that never ran. Its admission marker says
    no worker took it, so it is sent again uncounted and runs, on its first attempt, once the
    other worker is free."""
    long_s = 4 * HEARTBEAT_S + 5
    requests_log = tmp_path / "requests.jsonl"
    monkeypatch.setenv(ENV_REQUEST_LOG, str(requests_log))
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        assert twin.pool is not None
        client = client_of(twin, 10 * BURST)
        first, second = twin.pool.pids()
        long_job = request(
            "admitted-long",
            CORRECT,
            task=ADD_TASK | {"limits": {"timeout_s": long_s + 20, "memory_mb": 512}},
            commands=[["sleep", str(long_s)]],
        )
        [held] = client.submit([long_job])
        running = _running(f"sleep {long_s}", (first, second))
        idle = second if running == first else first
        os.kill(idle, signal.SIGSTOP)  # its lease stays live for its term: capacity, lost
        try:
            [waiting] = client.submit([request("admitted-waiting", CORRECT)])
            results = [held.result(timeout=long_s + 120), waiting.result(timeout=long_s + 120)]
        finally:
            for pid in (first, second):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    assert [(r.status, r.reward, r.attempts) for r in results] == [(Status.SUCCEEDED, 1.0, 1)] * 2
    long_run, waited = (r.timings for r in results)
    assert long_run is not None and waited is not None and waited.started_at is not None
    # It waited for the long job, past three of the Execute step's heartbeats.
    assert waited.started_at - waited.queued_at > 3 * HEARTBEAT_S
    # Its work messages of the lapsed sends were dropped (their tokens are gone): one run.
    runs = [
        entry
        for line in requests_log.read_text().splitlines()
        if (entry := json.loads(line))["key"] == principals.WORKER
        and entry["method"] == "GET"
        and entry["path"].endswith("/jobs/admitted-waiting/job.json")
    ]
    assert len(runs) == 1


def test_a_killed_workers_job_counts_one_lost_sandbox_however_long_its_retry_waits() -> None:
    """Was a break (red team 25): a worker SIGKILLed mid-job left its name on the job's
    admission marker. The job's retry then waited for a busy pool, and each lapse of its
    heartbeat read that dead worker's name and counted another lost sandbox: after three, a
    masked `sandbox_error` for a job that never ran again. The lost-sandbox branch now clears
    the marker's taker, so the retry's waits are waits: one lost sandbox, then it runs."""
    long_s = 4 * HEARTBEAT_S + 5
    with LocalTwin(workers=2, heartbeat_s=HEARTBEAT_S) as twin:
        assert twin.pool is not None
        client = client_of(twin, 10 * BURST)
        limits = {"timeout_s": long_s + 20, "memory_mb": 512}
        jobs = [
            request(f"lost-{n}", CORRECT, task=ADD_TASK | {"limits": limits},
                    commands=[["sleep", str(long_s + n)]])
            for n in range(3)
        ]  # fmt: skip
        handles = client.submit(jobs)
        victim = _running(f"sleep {long_s}", tuple(twin.pool.pids()))
        _running(f"sleep {long_s + 1}", tuple(twin.pool.pids()))
        os.kill(victim, signal.SIGKILL)
        results = [handle.result(timeout=8 * long_s) for handle in handles]
    assert [(r.status, r.reward) for r in results] == [(Status.SUCCEEDED, 1.0)] * 3
    assert [r.attempts for r in results] == [2, 1, 1]


def _running(command: str, workers: tuple[int, ...]) -> int:
    """The worker whose sandbox runs `command`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for worker in workers:
            for pid in descendants(worker):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip() == (
                        command.encode()
                    ):
                        return worker
        time.sleep(0.2)
    raise AssertionError(f"no worker ran {command!r}")
