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


def acknowledge(scope: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge each finding (rule id -> reason) on `scope` and below, nowhere else."""
    for rule_id, reason in findings.items():
        Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def _actions(prefixes: tuple[str, ...]) -> dict[str, str]:
    return {
        f"AwsSolutions-IAM5[Action::s3:{action}*]": (
            "CDK's grant_read/grant_put: object-level actions, limited to the key patterns "
            "in this role's resources"
        )
        for action in prefixes
    }


def grant_objects(
    role: iam.IRole, bucket: s3.IBucket, reads: dict[str, str], puts: dict[str, str]
) -> None:
    """Grant read and put on key patterns of one bucket, acknowledging each pattern's
    wildcard on this role with its reason (pattern -> why this role needs it)."""
    bucket_id = logical_id(bucket)
    findings: dict[str, str] = {}
    for pattern, why in reads.items():
        bucket.grant_read(role, pattern)
        findings |= _actions(("GetBucket", "GetObject", "List"))
        findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{pattern}]"] = why
    for pattern, why in puts.items():
        bucket.grant_put(role, pattern)
        findings |= _actions(("Abort",))
        findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{pattern}]"] = why
    acknowledge(role, findings)
