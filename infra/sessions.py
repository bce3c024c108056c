"""Sessions' queues: none is a session's own. A session opens on the stack's one open queue,
which workers with room read 10 at a time. Each pool worker makes one inbox for the calls
of every session it hosts (deleted when it stops), and each client one reply queue for the
replies to all its sessions (deleted when it closes); the reaper deletes those whose owner
died, once their expiry tag passes. Their names share one prefix per stack, which the IAM
grants name."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.alarms import at_least
from infra.lambdas import TrialboxFunction
from infra.nag import acknowledge
from infra.queues import secure_queue
from trialbox.models.sessions import OPEN_TIMEOUT_S

# The SDK's calls: make its reply queue (tagged with its expiry, retagged to cover a later
# session), send calls to workers' inboxes, read replies, delete the queue at close. The
# worker's: make its inbox (tagged, the tag renewed while it lives), read calls, reply on the
# clients' reply queues, delete its inbox as it stops.
CLIENT_ACTIONS = [
    "sqs:CreateQueue",
    "sqs:TagQueue",
    "sqs:SendMessage",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:DeleteQueue",
]
WORKER_ACTIONS = CLIENT_ACTIONS
WHY = "workers' inboxes and clients' reply queues, named with the stack's session queue prefix"


def session_queue_prefix(stack_name: str) -> str:
    """`<stack>-s-`: a worker's inbox is `<prefix>w-<32 hex>`, a client's reply queue
    `<prefix>c-<32 hex>` (SQS names take 80 characters)."""
    return f"{stack_name[:40]}-s-"


def session_queues_arn(scope: Construct, prefix: str) -> str:
    return Stack.of(scope).format_arn(
        service="sqs", resource=f"{prefix}*", arn_format=ArnFormat.NO_RESOURCE_NAME
    )


def grant_session_queues(
    role: iam.IRole, scope: Construct, prefix: str, actions: list[str]
) -> None:
    arn = session_queues_arn(scope, prefix)
    role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[arn]))
    finding = (
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:"
        f"{prefix}*]"
    )
    acknowledge(role, {finding: WHY})


# A worker that took opens and died before it said `opened` gives them back after this.
OPEN_VISIBILITY = Duration.seconds(30)
# Opens waiting this long mean the pool has no room for sessions (full, or scaling from 0).
OPEN_WAIT_ALARM = Duration.minutes(2)


class OpenQueue(Construct):
    """Where sessions open: a worker with room for sessions takes up to 10 at a time (jobs
    never wait behind them, nor they behind jobs). It keeps an open only as long as its
    client waits for it (OPEN_TIMEOUT_S), so an open given up on is never hosted; with no
    DLQ, since an open nobody took is answered by its client's timeout, not by a consumer."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.queue = secure_queue(
            self, "Queue", visibility=OPEN_VISIBILITY, retention=Duration.seconds(OPEN_TIMEOUT_S)
        )
        acknowledge(
            self.queue,
            {
                "AwsSolutions-SQS3": (
                    "an open nobody took expires with its client's wait, which reports it; "
                    "a DLQ would hold only opens their clients gave up on"
                )
            },
        )
        age = self.queue.metric_approximate_age_of_oldest_message(
            period=Duration.minutes(1), statistic="Maximum"
        )
        at_least(
            self,
            "OldestOpen",
            age,
            OPEN_WAIT_ALARM.to_seconds(),
            "sessions wait for a worker with room: the pool is full, or cannot start",
            periods=3,
        )


REAPER_ACTIONS = ["sqs:ListQueueTags", "sqs:GetQueueAttributes", "sqs:DeleteQueue"]
REAP_EVERY = Duration.minutes(1)


def schedule_reaper(scope: Construct, reaper: TrialboxFunction, prefix: str) -> events.Rule:
    """Run the reaper (trialbox.pipeline.reaper) every minute: it deletes the session queues
    (inboxes, reply queues) whose owner died without deleting them, once their tag passes."""
    grant_session_queues(reaper.role, scope, prefix, REAPER_ACTIONS)
    # ListQueues names no resource (IAM takes only "*"); the prefix narrows what it lists.
    reaper.role.add_to_principal_policy(
        iam.PolicyStatement(actions=["sqs:ListQueues"], resources=["*"])
    )
    acknowledge(
        reaper.role,
        {"AwsSolutions-IAM5[Resource::*]": "sqs:ListQueues takes no resource; X-Ray's neither"},
    )
    return events.Rule(
        scope,
        "ReaperSchedule",
        schedule=events.Schedule.rate(REAP_EVERY),
        targets=[targets.LambdaFunction(reaper.function, retry_attempts=0)],
    )
