"""A queue always comes with its DLQ, encryption, TLS and two alarms (DESIGN section 8,
queue hygiene): anything in the DLQ, and a message older than the queue should ever hold."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_sqs as sqs
from constructs import Construct

MAX_RECEIVES = 3


class QueueWithDlq(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, visibility: Duration, max_age: Duration
    ) -> None:
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
        minute = Duration.minutes(1)
        self.dlq_alarm = self.dlq.metric_approximate_number_of_messages_visible(
            period=minute, statistic="Maximum"
        ).create_alarm(
            self,
            "DlqNotEmpty",
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="messages were dead-lettered: each names its reason",
        )
        self.age_alarm = self.queue.metric_approximate_age_of_oldest_message(
            period=minute, statistic="Maximum"
        ).create_alarm(
            self,
            "OldestMessage",
            threshold=max_age.to_seconds(),
            evaluation_periods=3,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="the queue's consumer is not keeping up, or is down",
        )
