"""The template's SQS event-source mappings, served with Lambda's semantics: batches, a real
SQS event, partial batch response (only records not named in batchItemFailures are deleted),
and the rest left to the visibility timeout. moto's own mapping would swallow messages."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from trialbox.local.patches import Invoke
from trialbox.local.resources import REGION, EventSourceMapping

log = logging.getLogger("trialbox.local")


def sqs_record(message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": {
            name: {
                "stringValue": value.get("StringValue"),
                "dataType": value["DataType"],
                "stringListValues": [],
                "binaryListValues": [],
            }
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }


class Poller(threading.Thread):
    def __init__(self, sqs: Any, mapping: EventSourceMapping, invoke: Invoke) -> None:
        super().__init__(daemon=True, name=f"poller-{mapping.function}")
        self.sqs = sqs
        self.mapping = mapping
        self.invoke = invoke
        self.stop = threading.Event()
        attrs = sqs.get_queue_attributes(QueueUrl=mapping.queue_url, AttributeNames=["QueueArn"])
        self.queue_arn = attrs["Attributes"]["QueueArn"]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("poller %s failed; polling again", self.mapping.function)

    def poll_once(self) -> int:
        answer = self.sqs.receive_message(
            QueueUrl=self.mapping.queue_url,
            MaxNumberOfMessages=self.mapping.batch_size,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = answer.get("Messages", [])
        if not messages:
            return 0
        event = {"Records": [sqs_record(m, self.queue_arn) for m in messages]}
        ok, out = self.invoke(self.mapping.function, json.dumps(event).encode())
        if not ok:  # the whole batch returns after its visibility timeout
            log.warning("%s failed: %.300s", self.mapping.function, out)
            return len(messages)
        failed: set[str] = set()
        if self.mapping.report_batch_item_failures:
            response = json.loads(out or b"{}") or {}
            failed = {f["itemIdentifier"] for f in response.get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            self.sqs.delete_message_batch(
                QueueUrl=self.mapping.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)
                ],
            )
        return len(messages)
