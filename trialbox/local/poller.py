"""The template's event sources for its functions.

- SQS event-source mappings, served with Lambda's semantics: long polls, batches (within
  Lambda's 6 MB payload), a real SQS event, partial batch response (only records not named
  in batchItemFailures are deleted), and the rest left to the visibility timeout. moto's own
  mapping would swallow messages.
- EventBridge schedules: the target invoked with a "Scheduled Event", at the rule's rate or
  every SCHEDULE_CAP_S, whichever is sooner (a twin's sessions live seconds, not hours).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from trialbox.local import limits
from trialbox.local.patches import Invoke
from trialbox.local.resources import ACCOUNT, REGION, EventSourceMapping, Schedule

log = logging.getLogger("trialbox.local")

SCHEDULE_CAP_S = 10.0
# Lambda long-polls a mapping's queue, at SQS's longest wait: an idle mapping costs a call per
# poller every 20 s, and a message that comes is received at once all the same.
LONG_POLL_S = 20


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
            WaitTimeSeconds=LONG_POLL_S,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = answer.get("Messages", [])
        if not messages:
            return 0
        messages, payload = self._within_payload_limit(messages)
        ok, out = self.invoke(self.mapping.function, payload)
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

    def _within_payload_limit(
        self, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], bytes]:
        """The batch as Lambda passes it: as many records as fit its 6 MB synchronous payload
        (https://docs.aws.amazon.com/lambda/latest/api/API_CreateEventSourceMapping.html,
        BatchSize); the rest go back to the queue at once, for the next batch."""
        records = [sqs_record(m, self.queue_arn) for m in messages]
        payload = json.dumps({"Records": records}).encode()
        kept = len(records)
        while len(payload) > limits.LAMBDA_REQUEST_BYTES and kept > 1:
            kept -= 1
            payload = json.dumps({"Records": records[:kept]}).encode()
        if kept < len(messages):
            self.sqs.change_message_visibility_batch(
                QueueUrl=self.mapping.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for i, m in enumerate(messages[kept:])
                ],
            )
        return messages[:kept], payload


def scheduled_event(rule: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}"],
        "detail": {},
    }


class Scheduler(threading.Thread):
    def __init__(self, schedule: Schedule, invoke: Invoke) -> None:
        super().__init__(daemon=True, name=f"schedule-{schedule.rule}")
        self.schedule = schedule
        self.invoke = invoke
        self.stop = threading.Event()

    def run(self) -> None:
        every = min(self.schedule.every_s, SCHEDULE_CAP_S)
        while not self.stop.wait(every):
            event = json.dumps(scheduled_event(self.schedule.rule)).encode()
            try:
                ok, out = self.invoke(self.schedule.function, event)
            except Exception:
                log.exception("schedule %s failed; running it again later", self.schedule.rule)
                continue
            if not ok:  # EventBridge retries per the target's policy; the next run is as good
                log.warning("%s failed: %.300s", self.schedule.function, out)
