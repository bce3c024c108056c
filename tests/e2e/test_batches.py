"""Many samples, one execution (docs/batches.md), end to end on the twin: the requests of one
dispatcher invocation run as one Batch execution, each sample with its own result, under one
billed transition per sample, counted from the executions' histories."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.processes import cmdline, descendants
from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox.local import principals
from trialbox.local.requestlog import ENV_REQUEST_LOG, calls
from trialbox.local.twin import LocalTwin
from trialbox.metering import execution_transitions
from trialbox.models import ExecutionResult, Status
from trialbox.models.batches import BatchInput
from trialbox.pipeline.admission import Admission
from trialbox.sdk import Client, Resources

log = logging.getLogger(__name__)

WRONG = "def add(a, b):\n    return 3\n"


def twin_of(client: Client) -> LocalTwin:
    twin = client.aio._twin
    assert twin is not None
    return twin


def executions(twin: LocalTwin, output: str) -> list[dict[str, Any]]:
    sfn = twin.client("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=twin.output(output))
    return [e for page in pages for e in page["executions"]]


def _client(twin: LocalTwin) -> Client:
    """A client of a twin this test made itself (its own workers and heartbeat)."""
    return Client(
        Resources.from_outputs(twin.outputs),
        endpoint_url=twin.endpoint_url,
        session=boto3.session.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
        ),
    )


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
        twin.leased(8)
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


def _running(workers: list[int], command: list[str]) -> int | None:
    """A worker whose sandbox runs the sample's command (taken: a kill before is no loss)."""
    for pid in workers:
        if any(cmdline(child) == command for child in descendants(pid)):
            return pid
    return None


def test_a_worker_killed_mid_batch_reruns_only_its_own_sample() -> None:
    """Two samples of one batch on two workers; the worker running one is SIGKILLed. Its
    claim's lease lapses, its message comes back, and the replacement takes the sample over
    (attempt + 1) within 3 x the heartbeat; the other sample runs once. Each ends with one
    correct result.

    Two samples sent together may still start apart (a loaded machine's dispatcher can take
    them in two invocations): that run tests the Rollout path, not this one, so it is run
    again on a fresh twin, at most twice."""
    for _ in range(3):
        if _kill_one_of_a_batch(heartbeat_s=5):
            return
    pytest.fail("two samples sent together never started as one batch in three runs")


def _kill_one_of_a_batch(heartbeat_s: int) -> bool:
    """The scenario on a fresh twin: False, with nothing killed, when no batch started."""
    with LocalTwin(workers=2, heartbeat_s=heartbeat_s) as twin:
        assert twin.pool is not None
        client = _client(twin)
        twin.leased(2)
        sleeps = [["sleep", "4"]]
        requests = [request(f"b-lost-{n}", CORRECT, commands=sleeps) for n in range(2)]
        handles = client.submit(requests)
        deadline = time.monotonic() + 60
        while not (running := _running(twin.pool.pids(), sleeps[0])):
            assert time.monotonic() < deadline, "no worker took a sample"
            time.sleep(0.05)
        if not executions(twin, c.OUTPUT_BATCH_ARN):
            log.warning("the two samples started apart: the scenario runs again")
            client.close()
            return False
        os.kill(running, signal.SIGKILL)
        killed_at = time.monotonic()
        results = client.gather(handles, timeout=180)
        assert [r.reward for r in results] == [1.0, 1.0]
        assert sorted(r.attempts for r in results) == [1, 2], [r.attempts for r in results]
        assert time.monotonic() - killed_at < 3 * heartbeat_s + 10
        (batch,) = executions(twin, c.OUTPUT_BATCH_ARN)
        assert batch["status"] == "SUCCEEDED"
        assert not executions(twin, c.OUTPUT_ROLLOUT_ARN)
        client.close()
        return True


@pytest.mark.parametrize("together", [True, False], ids=["in-a-batch", "alone"])
def test_cancelling_a_running_sample_kills_its_sandbox_and_leaves_the_others(
    together: bool,
) -> None:
    """A sample runs a long command and is cancelled while it runs: its sandbox is killed and
    its slot comes back long before the command would end, and it ends `cancelled`. In a
    batch (beside a sample that runs as it would), the holder's next renewal finds its claim
    flagged; alone, its Rollout execution is stopped and the next heartbeat fails."""
    with LocalTwin(workers=2, heartbeat_s=5) as twin:
        assert twin.pool is not None
        client = _client(twin)
        admission = twin.leased(2)
        limits = {"timeout_s": 300, "memory_mb": 512}  # the cancel ends it, not its deadline
        long_one = request(
            "b-cancel-long",
            CORRECT,
            task=ADD_TASK | {"limits": limits},
            commands=[["sleep", "300"]],
        )
        others = [request("b-cancel-other", CORRECT)] if together else []
        handles = client.submit([long_one, *others])
        deadline = time.monotonic() + 60
        while not _running(twin.pool.pids(), ["sleep", "300"]):
            assert time.monotonic() < deadline, "no worker ran the long sample"
            time.sleep(0.05)
        client.cancel([handles[0]])
        cancelled_at = time.monotonic()
        results = client.gather(handles, timeout=120)
        assert [(r.status, r.reward) for r in results] == [(Status.CANCELLED, None)] + [
            (Status.SUCCEEDED, 1.0) for _ in others
        ], results
        deadline = cancelled_at + 30  # a renewal or heartbeat (every heartbeat / 3) sees it
        while _running(twin.pool.pids(), ["sleep", "300"]) or admission.in_flight():
            assert time.monotonic() < deadline, "the cancelled sample's sandbox ran on"
            time.sleep(0.2)
        # The batch ends once its ledger counts the cancelled sample too, which its holder's
        # finish message tells the finisher after the slot came back (seen RUNNING here).
        while (batches := executions(twin, c.OUTPUT_BATCH_ARN)) and any(
            b["status"] == "RUNNING" for b in batches
        ):
            assert time.monotonic() < deadline, f"the batch never ended: {batches}"
            time.sleep(0.2)
        assert [b["status"] for b in batches] == (["SUCCEEDED"] if together else [])
        client.close()


def _beats(log: Path) -> int:
    """SendTaskHeartbeat calls, from the twin's request log."""
    return sum(call.operation == "SendTaskHeartbeat" for call in calls(log))


def _taskset_reads(log: Path) -> dict[str, int]:
    """GetObject calls on task sets, by principal, from the twin's request log."""
    reads: dict[str, int] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry["service"] == "s3" and entry["method"] == "GET" and "/tasksets/" in entry["path"]:
            reads[entry["key"]] = reads.get(entry["key"], 0) + 1
    return reads


def test_a_group_is_graded_in_batches_that_each_read_the_task_set_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A GRPO group of 8 completions of one pushed task: Batch executions prepare them (one Run
    each, none alone), reading the task set at most once each, and the samples run in parallel
    on the pool. The group is one SendMessageBatch; the dispatcher's mapping runs two
    invocations at once on the twin (more on AWS), so it may arrive in two receives, as two
    batches. Each result is exactly what its completion gets graded alone (a group of one: its
    own Rollout)."""
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv(ENV_REQUEST_LOG, str(log))
    kinds = [CORRECT, WRONG, "def add(a, b)\n    return a + b\n"]  # the last: a SyntaxError
    completions = [f"```python\n{kinds[i % len(kinds)]}```" for i in range(8)]
    with Client.local(workers=8) as local:
        twin = twin_of(local)
        twin.leased(8)
        ref = local.push_tasks([ADD_TASK], name="group")
        task = ref.task(ADD_TASK["task_id"])
        reads_before = _taskset_reads(log)
        group = local.run_group(task, completions, group_id="g-8", timeout=300)
        reads = _taskset_reads(log)
        batches = executions(twin, c.OUTPUT_BATCH_ARN)
        assert 1 <= len(batches) <= 2, batches
        assert executions(twin, c.OUTPUT_ROLLOUT_ARN) == []
        assert transitions(twin, batches) <= len(completions)
        functions_read = {
            key: n - reads_before.get(key, 0)
            for key, n in reads.items()
            if key.startswith(principals.FUNCTION_PREFIX)
        }
        assert 1 <= sum(functions_read.values()) <= len(batches), functions_read
        beats_before = _beats(log)
        alone = [
            local.run_group(task, [completion], group_id=f"g-alone-{i}", timeout=120)[0]
            for i, completion in enumerate(completions[: len(kinds)])
        ]
        # A job run alone is asked about once, before it runs (a stale redelivery's execution
        # moved on), and again only once a beat is due: none of these lasts a beat's interval.
        assert _beats(log) - beats_before == len(alone)

    def graded(result: ExecutionResult) -> tuple[Any, ...]:
        tests = [(t.test_id, t.outcome) for t in result.tests]
        return (result.status, result.reward, result.loss_mask, result.tests_passed, tests)

    assert [graded(r) for r in group[: len(kinds)]] == [graded(r) for r in alone]
    assert [graded(r) for r in group] == [graded(group[i % len(kinds)]) for i in range(8)]
    assert len({r.reward for r in group}) == len(kinds), group  # the kinds really differ
