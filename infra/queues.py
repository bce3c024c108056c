"""A queue always comes with its DLQ, encryption and TLS (DESIGN section 8)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from constructs import Construct

MAX_RECEIVES = 3


class QueueWithDlq(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, visibility: Duration) -> None:
        super().__init__(scope, construct_id)
        self.dlq = sqs.Queue(
            self,
            "Dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=visibility,
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=MAX_RECEIVES, queue=self.dlq),
        )
