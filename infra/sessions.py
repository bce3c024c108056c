"""Sessions' queues: each session has an inbox and an outbox of its own, made by the client
(the SDK) when it opens the session and deleted when it closes, or by the hosting worker at
the session's TTL. Their names share one prefix per stack, which the IAM grants name."""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

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
