"""Sessions' queues: each session has an inbox and an outbox of its own, made by the client
(the SDK) when it opens the session and deleted when it closes, or by the hosting worker at
the session's TTL, or by the reaper when neither is left to. Their names share one prefix per
stack, which the IAM grants name."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.lambdas import TrialboxFunction
from infra.nag import acknowledge

# The SDK's calls on a session's queues: create (tagged with its expiry), call, read replies,
# delete at close. The worker's: read calls, reply, delete at the TTL.
CLIENT_ACTIONS = [
    "sqs:CreateQueue",
    "sqs:TagQueue",
    "sqs:SendMessage",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:DeleteQueue",
]
WORKER_ACTIONS = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:SendMessage", "sqs:DeleteQueue"]
WHY = "each session's own inbox and outbox, named with the stack's session queue prefix"


def session_queue_prefix(stack_name: str) -> str:
    """`<stack>-s-`: a session's queues are `<prefix><session id>-in` and `-out` (SQS names
    take 80 characters; a session id is 32)."""
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


REAPER_ACTIONS = ["sqs:ListQueueTags", "sqs:GetQueueAttributes", "sqs:DeleteQueue"]
REAP_EVERY = Duration.minutes(1)


def schedule_reaper(scope: Construct, reaper: TrialboxFunction, prefix: str) -> events.Rule:
    """Run the reaper (trialbox.pipeline.reaper) every minute: it deletes the queues of sessions
    past their TTL that neither their client nor their host ended."""
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
