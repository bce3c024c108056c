"""The requests queue and the dispatcher that turns each message into one execution."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from infra.lambdas import TrialboxFunction
from infra.queues import QueueWithDlq

DISPATCHER_TIMEOUT = Duration.seconds(30)


class Intake(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, batch_size: int) -> None:
        super().__init__(scope, construct_id)
        # Visibility >= 6 x the consumer's timeout (queue hygiene).
        self.requests = QueueWithDlq(
            self,
            "Requests",
            visibility=Duration.seconds(DISPATCHER_TIMEOUT.to_seconds() * 6),
            max_age=Duration.minutes(5),  # the dispatcher only starts executions
        )
        self.batch_size = batch_size

    def attach(self, dispatcher: TrialboxFunction) -> None:
        dispatcher.function.add_event_source(
            SqsEventSource(
                self.requests.queue,
                batch_size=self.batch_size,
                report_batch_item_failures=True,
            )
        )
        # SendMessage alone: grant_send_messages adds GetQueueAttributes and GetQueueUrl, which
        # the dispatcher never calls (it has the DLQ's URL), and tests/iam fails unused grants.
        self.requests.dlq.grant(dispatcher.role, "sqs:SendMessage")
