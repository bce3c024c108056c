"""Many samples, one execution (docs/batches.md), end to end on the twin: the requests of one
dispatcher invocation run as one Batch execution, each sample with its own result, under one
billed transition per sample, counted from the executions' histories."""

from __future__ import annotations

from typing import Any

from tests.support.tasks import CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox.metering import execution_transitions
from trialbox.models import Status
from trialbox.sdk import Client

WRONG = "def add(a, b):\n    return 3\n"


def executions(client: Client, output: str) -> list[dict[str, Any]]:
    twin = client.aio._twin
    assert twin is not None
    sfn = twin.client("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=twin.output(output))
    return [e for page in pages for e in page["executions"]]


def transitions(client: Client, found: list[dict[str, Any]]) -> int:
    twin = client.aio._twin
    assert twin is not None
    sfn = twin.client("stepfunctions")
    return sum(execution_transitions(sfn, e["executionArn"]) for e in found)


def test_samples_sent_together_run_as_batches_under_one_transition_each(client: Client) -> None:
    before = {e["executionArn"] for e in executions(client, c.OUTPUT_BATCH_ARN)}
    alone = {e["executionArn"] for e in executions(client, c.OUTPUT_ROLLOUT_ARN)}
    requests = [request(f"b-many-{i}", CORRECT if i % 2 else WRONG) for i in range(30)]
    results = client.gather(client.submit(requests), timeout=600)
    assert [(r.status, r.reward) for r in results] == [
        (Status.SUCCEEDED, 1.0 if i % 2 else 0.5) for i in range(30)
    ]
    batches = [e for e in executions(client, c.OUTPUT_BATCH_ARN) if e["executionArn"] not in before]
    singles = [
        e for e in executions(client, c.OUTPUT_ROLLOUT_ARN) if e["executionArn"] not in alone
    ]
    assert batches, "no sample ran in a batch"
    assert all(e["status"] == "SUCCEEDED" for e in batches)
    billed = transitions(client, batches) + transitions(client, singles)
    per_sample = billed / len(requests)
    assert per_sample <= 1.0, (len(batches), len(singles), billed)
