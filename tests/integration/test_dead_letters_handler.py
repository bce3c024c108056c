"""The requests DLQ's consumer as Lambda runs it: an SQS event in, one result per request whose
execution never started, and what the dispatcher dead-lettered on purpose left alone."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import pytest

from tests.integration.test_recorder_handler import CONTEXT
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox import constants as c
from trialbox.models import Status


@pytest.fixture
def handler(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Any:
    rollout, batch = (
        aws.state_machine(name, {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
        for name in ("rollout", "batch")
    )
    for name, value in {
        c.ENV_TASKSETS_BUCKET: "tasksets",
        c.ENV_TRACES_BUCKET: "traces",
        c.ENV_EXECUTIONS_TABLE: "executions",
        c.ENV_ADMISSION_TABLE: aws.admission.table,
        c.ENV_ROLLOUT_ARN: rollout,
        c.ENV_BATCH_ARN: batch,
        "POWERTOOLS_SERVICE_NAME": "trialbox-dead-letters",
        "POWERTOOLS_METRICS_NAMESPACE": c.METRICS_NAMESPACE,
        "POWERTOOLS_TRACE_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("functions.dead_letters.handler", None)  # it reads its settings at import
    return importlib.import_module("functions.dead_letters.handler").handler


def record(body: str, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "messageId": body[:20],
        "receiptHandle": "r",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": attributes or {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:requests-dlq",
        "awsRegion": "us-east-1",
    }


def test_each_dead_lettered_request_gets_one_sandbox_error_and_chosen_ones_are_left(
    aws: Aws, handler: Any
) -> None:
    lost = json.dumps({"request_id": "r-lost", "task": ADD_TASK, "files": {"solution.py": CORRECT}})
    reused = json.dumps({"request_id": "r-reused", "task": ADD_TASK, "files": {}})
    reason = {"reason": {"stringValue": "reused", "dataType": "String"}}
    event = {"Records": [record(lost), record(reused, reason), record("not json")]}
    assert handler(event, CONTEXT) == {"batchItemFailures": []}
    item = aws.item("r-lost")
    assert item is not None and item["status"] == {"S": Status.SANDBOX_ERROR.value}
    assert aws.item("r-reused") is None
