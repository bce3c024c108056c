"""cdk-nag acknowledgements, each on the construct that needs it and with its reason, so that
the same finding anywhere else still fails synth."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import IConstruct

XRAY = (
    "X-Ray PutTraceSegments/PutTelemetryRecords have no resource-level permissions "
    "(Lambda active tracing)"
)


def logical_id(construct: IConstruct) -> str:
    """The logical id of an L2's resource, as granular nag findings name it."""
    element = construct.node.default_child
    assert isinstance(element, CfnElement)
    return Stack.of(construct).get_logical_id(element)


def executions_finding(state_machine: IConstruct) -> str:
    """cdk-nag's name for a grant on a state machine's executions (`grant_execution`)."""
    return (
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:"
        '<AWS::AccountId>:execution:{"Fn::Select":[6,{"Fn::Split":[":",'
        f'{{"Ref":"{logical_id(state_machine)}"}}]}}]}}:*]'
    )


def acknowledge(scope: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge each finding (rule id -> reason) on `scope` and below, nowhere else."""
    for rule_id, reason in findings.items():
        Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def grant_objects(
    role: iam.IRole,
    bucket: s3.IBucket,
    reads: dict[str, str],
    puts: dict[str, str],
    *,
    not_found: str | None = None,
) -> None:
    """Grant s3:GetObject on each read pattern and s3:PutObject on each put pattern of one
    bucket: the actions the code calls, no more (tests/iam proves it call by call; CDK's
    grant_read/grant_put would add GetBucket*, List*, Abort* and the object-lock puts). Each
    pattern's wildcard is acknowledged on this role with its reason (pattern -> why this role
    needs it). The buckets are SSE-S3: no key grant is needed.

    `not_found`: why this role must tell a missing key from a forbidden one. S3 answers
    NoSuchKey only to a caller that may list the bucket (s3:ListBucket), AccessDenied to any
    other."""
    bucket_id = logical_id(bucket)
    findings: dict[str, str] = {}
    for action, patterns in (("s3:GetObject", reads), ("s3:PutObject", puts)):
        if not patterns:
            continue
        objects = [bucket.arn_for_objects(pattern) for pattern in patterns]
        role.add_to_principal_policy(iam.PolicyStatement(actions=[action], resources=objects))
        for pattern, why in patterns.items():
            findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{pattern}]"] = why
    if not_found:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn])
        )
    acknowledge(role, findings)
