"""moto in-process: fake credentials first, the mock started before any client is made."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber
from moto.sqs.models import Queue as SqsQueue
from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

from tests.support.moto import (
    MOTO_CONFIG,
    REGION,
    Aws,
    admission_table,
    one_at_a_time,
    waiting_for_a_sender,
)
from trialbox import constants as c
from trialbox.local import patches
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.sdk import Resources, core


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(BotocoreStubber, "process_request", one_at_a_time)
    monkeypatch.setattr(SqsQueue, "wait_for_messages", waiting_for_a_sender)
    # The twin's patches of moto's callback defects, for a worker that takes a job's message as
    # soon as it is sent (its first heartbeat and its answer may come before moto's execution
    # set the task up): without them, such a job was dropped as stale and never ran. The
    # originals are noted first, and put back after the test.
    for name in ("notify_heartbeat", "setup_heartbeat_endpoint"):
        monkeypatch.setattr(CallbackEndpoint, name, getattr(CallbackEndpoint, name))
    patches.accept_early_heartbeats()
    patches.keep_early_callbacks()
    with mock_aws(config=MOTO_CONFIG):
        s3 = boto3.client("s3")
        sqs = boto3.client("sqs")
        dynamodb = boto3.client("dynamodb")
        for bucket in ("tasksets", "traces"):
            s3.create_bucket(Bucket=bucket)
        dynamodb.create_table(
            TableName="executions",
            KeySchema=[{"AttributeName": c.TABLE_KEY, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": c.TABLE_KEY, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield Aws(
            s3=s3,
            sqs=sqs,
            sfn=boto3.client("stepfunctions"),
            dynamodb=dynamodb,
            tasksets=ObjectStore(s3, "tasksets"),
            traces=ObjectStore(s3, "traces"),
            table=ResultTable(dynamodb, "executions", ttl_days=30),
            work_queue=sqs.create_queue(QueueName="work")["QueueUrl"],
            dlq=sqs.create_queue(QueueName="requests-dlq")["QueueUrl"],
            admission=admission_table(dynamodb),
        )


@pytest.fixture
def preparer(aws: Aws) -> Preparer:
    return Preparer(aws.tasksets, aws.traces, heartbeat_s=30, margin_s=60)


@pytest.fixture
def resources(aws: Aws) -> Resources:
    """The SDK's view of the moto resources (with a requests queue)."""
    return Resources(
        requests_queue_url=aws.sqs.create_queue(QueueName="requests")["QueueUrl"],
        executions_table="executions",
        traces_bucket="traces",
        tasksets_bucket="tasksets",
    )


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's pump polls every 20-50 ms (not 0.2-2 s): a test takes well under a second."""
    monkeypatch.setattr(core, "POLL_S", 0.02)
    monkeypatch.setattr(core, "MAX_POLL_S", 0.05)
