"""moto in-process (tests/integration): its config, serialized data-store calls and the resources
the `aws` fixture makes."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from moto.core.botocore_stubber import BotocoreStubber
from moto.sqs.models import Queue as SqsQueue

from trialbox import constants as c
from trialbox.pipeline import admission
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.stores import ObjectStore, ResultTable

REGION = "us-east-1"
MOTO_CONFIG: Any = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": False},
}


# moto's in-process backends are not thread-safe: SQS's ReceiveMessage deep-copies a message
# while another thread's call changes it ("dictionary changed size during iteration"), which
# killed a test's fake pipeline thread. The services are; calls to the data stores are taken
# one at a time, as moto's server would if it were. Step Functions and Lambda are left out:
# their calls start work that calls back in. A long poll gives the data stores up while it
# waits (waiting_for_a_sender).
SERIAL_SERVICES = ("sqs", "dynamodb", "s3")
_serial = threading.RLock()
_held = threading.local()  # depth: how many times this thread holds _serial
_process_request = BotocoreStubber.process_request
_wait_for_messages = SqsQueue.wait_for_messages


def one_at_a_time(self: BotocoreStubber, request: Any) -> Any:
    host = str(request.url).split("://", 1)[-1].split("/", 1)[0]
    if not any(f"{service}." in host for service in SERIAL_SERVICES):
        return _process_request(self, request)
    with _serial:
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            return _process_request(self, request)
        finally:
            _held.depth -= 1


def waiting_for_a_sender(queue: SqsQueue, timeout: int) -> None:
    """moto's long poll (ReceiveMessage's WaitTimeSeconds) waits for a message with the data
    stores given up, so that a sender can add the message it waits for (moto wakes the poll
    then). Was a flake of a loaded suite: held through a worker's 1 s long polls, the lock let
    no message arrive during one, and the state machine's SendMessage, woken only as a poll
    ended, lost the lock to the next poll again and again: a job started 17 s late."""
    if getattr(_held, "depth", 0) != 1:  # not one ReceiveMessage's alone: as moto does
        _wait_for_messages(queue, timeout)
        return
    _serial.release()
    try:
        _wait_for_messages(queue, timeout)
    finally:
        _serial.acquire()


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
    admission: Admission

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


def admission_table(dynamodb: Any, name: str = "admission", slots: int = 1000) -> Admission:
    """The admission table as the stack makes it, with a pool of `slots` live slots (one lease
    that lasts the test): tests of other things are never held up by admission."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": admission.PART, "KeyType": "HASH"},
            {"AttributeName": admission.ID, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": admission.PART, "AttributeType": "S"},
            {"AttributeName": admission.ID, "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    table = Admission(dynamodb, name)
    if slots:
        table.lease("test-pool", slots, term_s=86400)
    return table
