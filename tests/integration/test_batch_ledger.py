"""A batch's ledger under moto, against a real waitForTaskToken state: its execution ends when
the last of its samples has its result, once, however often a sample is reported or its Run is
retried."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.integration.test_worker import wait_for
from tests.support.moto import Aws
from trialbox.pipeline.batches import Ledger


def started(aws: Aws, name: str) -> tuple[str, str]:
    """(the execution, the task token its Run step waits on): a waitForTaskToken state that
    sends its token to a queue of its own."""
    queue = aws.sqs.create_queue(QueueName=f"tokens-{name}")["QueueUrl"]
    run: dict[str, Any] = {
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "TimeoutSeconds": 60,
        "Parameters": {"QueueUrl": queue, "MessageBody": {"token.$": "$$.Task.Token"}},
        "End": True,
    }
    machine = aws.state_machine(f"batch-{name}", {"StartAt": "Run", "States": {"Run": run}})
    arn = aws.sfn.start_execution(stateMachineArn=machine, name=name, input="{}")
    deadline = time.monotonic() + 10  # moto's execution thread sends it a moment later
    while time.monotonic() < deadline:
        messages = aws.messages(queue)
        if messages:
            return arn["executionArn"], json.loads(messages[0]["Body"])["token"]
        time.sleep(0.05)
    raise AssertionError("Run sent no message")


@pytest.fixture
def ledger(aws: Aws) -> Ledger:
    return Ledger(aws.dynamodb, aws.sfn, aws.admission.table)


def test_the_last_result_ends_the_batch_once(aws: Aws, ledger: Ledger) -> None:
    execution, token = started(aws, "b-1")
    ledger.open("b-1", 3, token)
    assert [ledger.finish("b-1", rid) for rid in ("r-1", "r-2", "r-2")] == [False] * 3
    assert aws.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
    assert ledger.finish("b-1", "r-3")
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"
    assert ledger.finish("b-1", "r-3")  # reported again: its token is gone, nothing raised


def test_a_run_opened_after_its_samples_finished_is_answered_at_once(
    aws: Aws, ledger: Ledger
) -> None:
    execution, token = started(aws, "b-late")
    assert not ledger.finish("b-late", "r-1")  # not opened yet: nothing to answer
    ledger.open("b-late", 1, token)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"


def test_a_ledger_written_first_by_a_finish_expires_and_ledgers_spread_over_shards(
    aws: Aws, ledger: Ledger
) -> None:
    """Was a hole (review H7): a sample finished before Run opened its ledger (or Run never
    did) left an item with no TTL; and every ledger shared one partition key."""
    ledger.finish("b-early", "r-1")
    items = [
        item
        for page in aws.dynamodb.get_paginator("scan").paginate(TableName=aws.admission.table)
        for item in page["Items"]
        if item["id"]["S"].startswith("b-")
    ]
    assert [i["id"]["S"] for i in items] == ["b-early"] and "expires_at" in items[0]
    parts = {ledger._key(f"b-{n}")["part"]["S"] for n in range(64)}
    assert len(parts) > 1
