"""A queue always comes with its DLQ, encryption, TLS and two alarms (docs/pipeline.md,
"Alarms"): anything in the DLQ, and a message older than the queue should ever hold."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.alarms import at_least

MAX_RECEIVES = 3


def secure_queue(
    scope: Construct,
    construct_id: str,
    *,
    visibility: Duration,
    retention: Duration,
    dead_letter_queue: sqs.DeadLetterQueue | None = None,
) -> sqs.Queue:
    """An SQS queue encrypted at rest (SQS-managed keys) that refuses requests without TLS."""
    return sqs.Queue(
        scope,
        construct_id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        visibility_timeout=visibility,
        retention_period=retention,
        dead_letter_queue=dead_letter_queue,
    )


class QueueWithDlq(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, visibility: Duration, max_age: Duration
    ) -> None:
        super().__init__(scope, construct_id)
        self.dlq = secure_queue(
            self,
            "Dlq",
            retention=Duration.days(14),
            # A DLQ's consumer (the requests DLQ's answers what dead-letters) gets 6 x its 30 s.
            visibility=Duration.minutes(3),
        )
        self.queue = secure_queue(
            self,
            "Queue",
            visibility=visibility,
            retention=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=MAX_RECEIVES, queue=self.dlq),
        )
        minute = Duration.minutes(1)
        depth = self.dlq.metric_approximate_number_of_messages_visible(
            period=minute, statistic="Maximum"
        )
        self.dlq_alarm = at_least(
            self, "DlqNotEmpty", depth, 1, "messages were dead-lettered: each names its reason"
        )
        age = self.queue.metric_approximate_age_of_oldest_message(
            period=minute, statistic="Maximum"
        )
        self.age_alarm = at_least(
            self,
            "OldestMessage",
            age,
            max_age.to_seconds(),
            "the queue's consumer is not keeping up, or is down",
            periods=3,
        )
