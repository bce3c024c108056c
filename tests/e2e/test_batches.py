"""Many samples, one execution (docs/batches.md), end to end on the twin: the requests of one
dispatcher invocation run as one Batch execution, each sample with its own result, under one
billed transition per sample, counted from the executions' histories."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import boto3

from tests.support.tasks import CORRECT
from tests.support.twin import cmdline, descendants, request
from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.metering import execution_transitions
from trialbox.models import Status
from trialbox.models.batches import BatchInput
from trialbox.pipeline.admission import Admission
from trialbox.sdk import Client, Resources

WRONG = "def add(a, b):\n    return 3\n"


def twin_of(client: Client) -> LocalTwin:
    twin = client.aio._twin
    assert twin is not None
    return twin


def executions(twin: LocalTwin, output: str) -> list[dict[str, Any]]:
    sfn = twin.client("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=twin.output(output))
    return [e for page in pages for e in page["executions"]]


def transitions(twin: LocalTwin, found: list[dict[str, Any]]) -> int:
    sfn = twin.client("stepfunctions")
    return sum(execution_transitions(sfn, e["executionArn"]) for e in found)


def test_samples_sent_together_run_as_one_batch_under_one_transition_each() -> None:
    """Eight samples submitted together, with a slot free for each: one dispatcher invocation
    admits them all and starts them as one Batch execution. Billed transitions, counted from
    every execution's history (the Rollout's too, for any sample that went alone): at most
    one per sample."""
    with Client.local(workers=8) as local:
        twin = twin_of(local)
        admission = Admission(twin.client("dynamodb"), twin.output(c.OUTPUT_ADMISSION_TABLE))
        deadline = time.monotonic() + 60
        while admission.capacity() < 8:  # every worker's lease is in
            assert time.monotonic() < deadline, "the workers never leased their slots"
            time.sleep(0.2)
        requests = [request(f"b-many-{i}", CORRECT if i % 2 else WRONG) for i in range(8)]
        results = local.gather(local.submit(requests), timeout=300)
        assert [(r.status, r.reward, r.attempts) for r in results] == [
            (Status.SUCCEEDED, 1.0 if i % 2 else 0.5, 1) for i in range(8)
        ]
        batches = executions(twin, c.OUTPUT_BATCH_ARN)
        singles = executions(twin, c.OUTPUT_ROLLOUT_ARN)
        assert batches and all(e["status"] == "SUCCEEDED" for e in batches), batches
        billed = transitions(twin, batches) + transitions(twin, singles)
        assert billed / len(requests) <= 1.0, (len(batches), len(singles), billed)


def test_a_batch_whose_run_fails_gives_each_sample_one_sandbox_error(client: Client) -> None:
    """Run fails (its requests' object was never written: a dispatcher writes it before it
    starts a batch, so the batch is started here by hand): the Catch runs Settle, and each
    sample gets its one masked `sandbox_error`, naming the error, and its slot back."""
    twin = client.aio._twin
    assert twin is not None
    admission = Admission(twin.client("dynamodb"), twin.output(c.OUTPUT_ADMISSION_TABLE))
    ids = ["b-settle-1", "b-settle-2"]
    admission.lease("settle-test", len(ids), term_s=60)
    held = admission.in_flight()
    for request_id in ids:
        assert admission.admit(request_id)
    batch = BatchInput(
        batch_id="b-settle",
        requests_uri=f"s3://{twin.output(c.OUTPUT_TRACES_BUCKET)}/batches/b-settle.json",
        request_ids=ids,
    )
    twin.client("stepfunctions").start_execution(
        stateMachineArn=twin.output(c.OUTPUT_BATCH_ARN),
        name=batch.batch_id,
        input=batch.model_dump_json(),
    )
    admission.leave("settle-test")
    table = twin.client("dynamodb")
    deadline = time.monotonic() + 60
    for request_id in ids:  # Settle's results (a request sent now would find them)
        key = {c.TABLE_KEY: {"S": request_id}}
        while "Item" not in table.get_item(
            TableName=twin.output(c.OUTPUT_EXECUTIONS_TABLE), Key=key, ConsistentRead=True
        ):
            assert time.monotonic() < deadline, f"{request_id} was never settled"
            time.sleep(0.2)
    handles = client.submit([request(request_id, CORRECT) for request_id in ids])
    results = client.gather(handles, timeout=60)
    for result in results:
        assert (result.status, result.reward, result.loss_mask) == (
            Status.SANDBOX_ERROR, None, True
        ), result  # fmt: skip
        assert result.error, result
    assert set(admission.admitted()).isdisjoint(ids) and admission.in_flight() == held


def _running_sleep(workers: list[int]) -> int | None:
    """A worker whose sandbox runs the sample's command (taken: a kill before is no loss)."""
    for pid in workers:
        if any(cmdline(child) == ["sleep", "4"] for child in descendants(pid)):
            return pid
    return None


def test_a_worker_killed_mid_batch_reruns_only_its_own_sample() -> None:
    """Two samples of one batch on two workers; the worker running one is SIGKILLed. Its
    claim's lease lapses, its message comes back, and the replacement takes the sample over
    (attempt + 1) within 3 x the heartbeat; the other sample runs once. Each ends with one
    correct result."""
    heartbeat_s = 5
    with LocalTwin(workers=2, heartbeat_s=heartbeat_s) as twin:
        assert twin.pool is not None
        client = Client(
            Resources.from_outputs(twin.outputs),
            endpoint_url=twin.endpoint_url,
            session=boto3.session.Session(
                aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
            ),
        )
        admission = Admission(twin.client("dynamodb"), twin.output(c.OUTPUT_ADMISSION_TABLE))
        deadline = time.monotonic() + 30
        while admission.capacity() < 2:  # both workers' leases: one batch admits both
            assert time.monotonic() < deadline, "the workers never leased their slots"
            time.sleep(0.2)
        sleeps = [["sleep", "4"]]
        requests = [request(f"b-lost-{n}", CORRECT, commands=sleeps) for n in range(2)]
        handles = client.submit(requests)
        deadline = time.monotonic() + 60
        while not (running := _running_sleep(twin.pool.pids())):
            assert time.monotonic() < deadline, "no worker took a sample"
            time.sleep(0.05)
        os.kill(running, signal.SIGKILL)
        killed_at = time.monotonic()
        results = client.gather(handles, timeout=180)
        assert [r.reward for r in results] == [1.0, 1.0]
        assert sorted(r.attempts for r in results) == [1, 2], [r.attempts for r in results]
        assert time.monotonic() - killed_at < 3 * heartbeat_s + 10
        (batch,) = executions(twin, c.OUTPUT_BATCH_ARN)
        assert batch["status"] == "SUCCEEDED"
        client.close()
