"""moto in-process: fake credentials first, the mock started before any client is made."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber

from trialbox import constants as c
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.sdk import Resources, core

REGION = "us-east-1"
MOTO_CONFIG: Any = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": False},
}


# moto's in-process backends are not thread-safe: SQS's ReceiveMessage deep-copies a message
# while another thread's call changes it ("dictionary changed size during iteration"), which
# killed a test's fake pipeline thread. The services are; calls to the data stores are taken
# one at a time, as moto's server would if it were. Step Functions and Lambda are left out:
# their calls start work that calls back in.
SERIAL_SERVICES = ("sqs", "dynamodb", "s3")
_serial = threading.RLock()
_process_request = BotocoreStubber.process_request


def _one_at_a_time(self: BotocoreStubber, request: Any) -> Any:
    host = str(request.url).split("://", 1)[-1].split("/", 1)[0]
    if not any(f"{service}." in host for service in SERIAL_SERVICES):
        return _process_request(self, request)
    with _serial:
        return _process_request(self, request)


@dataclass
class Aws:
    s3: Any
    sqs: Any
    sfn: Any
    dynamodb: Any
    tasksets: ObjectStore
    traces: ObjectStore
    table: ResultTable
    work_queue: str
    dlq: str

    def item(self, request_id: str) -> dict[str, Any] | None:
        found = self.dynamodb.get_item(
            TableName=self.table.table, Key={c.TABLE_KEY: {"S": request_id}}
        )
        return found.get("Item")

    def messages(self, queue: str) -> list[dict[str, Any]]:
        answer = self.sqs.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )
        return list(answer.get("Messages", []))

    def state_machine(self, name: str, definition: dict[str, Any]) -> str:
        arn = self.sfn.create_state_machine(
            name=name,
            definition=json.dumps(definition),
            roleArn="arn:aws:iam::123456789012:role/sfn",
        )["stateMachineArn"]
        return str(arn)


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
    monkeypatch.setattr(BotocoreStubber, "process_request", _one_at_a_time)
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
        )


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
