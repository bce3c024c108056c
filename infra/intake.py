"""The requests queue, the dispatcher that turns each message into one execution once a pool slot
is free for it, and the consumer of the requests DLQ, which answers what still dead-letters."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from infra.lambdas import TrialboxFunction
from infra.queues import QueueWithDlq

DISPATCHER_TIMEOUT = Duration.seconds(30)
# Dispatchers at once. While the pool is full each holds its batch up to its timeout waiting
# for a slot (then sends it back): the backlog stays in the queue, not in Lambda.
DISPATCHER_CONCURRENCY = 10


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

    def attach(self, dispatcher: TrialboxFunction, dead_letters: TrialboxFunction) -> None:
        dispatcher.function.add_event_source(
            SqsEventSource(
                self.requests.queue,
                batch_size=self.batch_size,
                report_batch_item_failures=True,
                max_concurrency=DISPATCHER_CONCURRENCY,
            )
        )
        # A request that waited for a slot goes back as a new message (never a failed receive).
        self.requests.queue.grant(dispatcher.role, "sqs:SendMessage")
        dead_letters.function.add_event_source(
            SqsEventSource(self.requests.dlq, batch_size=10, report_batch_item_failures=True)
        )
        # SendMessage alone: grant_send_messages adds GetQueueAttributes and GetQueueUrl, which
        # the dispatcher never calls (it has the DLQ's URL), and tests/iam fails unused grants.
        self.requests.dlq.grant(dispatcher.role, "sqs:SendMessage")
