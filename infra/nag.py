"""cdk-nag acknowledgements. Every one carries its reason; anything else fails synth."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations

from trialbox import constants as c

S3_GRANTS = "CDK's grant_read/grant_put on one bucket: object-level actions on that bucket only"
# The per-request key patterns each role is granted: one object per request id, never a prefix
# wider than the step's own kind of object.
TRACES_KEYS = {
    f"{c.PAYLOADS_PREFIX}*": "the dispatcher and Prepare read large requests by request id",
    f"{c.JOBS_PREFIX}*/job.json": "Prepare writes, the worker and Score read the job spec",
    f"{c.JOBS_PREFIX}*/report.json": "the worker writes, Score reads the raw run report",
    f"{c.JOBS_PREFIX}*/result.json": "Score writes, Record reads the scored result",
    f"{c.TRACES_PREFIX}*": "Record writes each request's trace",
}


def acknowledged(stack: Stack) -> dict[str, str]:
    ids = {name: stack.get_logical_id(res) for name, res in _resources(stack).items()}
    return {
        "AwsSolutions-EC23": (
            "interface endpoint security groups allow 443 from the VPC CIDR, a Fn::GetAtt the "
            "rule cannot evaluate"
        ),
        "AwsSolutions-ECS2": "the worker's environment holds resource names only, no secrets",
        "AwsSolutions-L1": (
            "python3.13 is pinned on purpose: the bundle's binary wheels are built for it"
        ),
        "AwsSolutions-IAM5[Resource::*]": (
            "X-Ray PutTraceSegments/PutTelemetryRecords and ecr:GetAuthorizationToken have no "
            "resource-level permissions"
        ),
        **{
            f"AwsSolutions-IAM5[Action::s3:{action}*]": S3_GRANTS
            for action in ("Abort", "GetBucket", "GetObject", "List")
        },
        **{
            f"AwsSolutions-IAM5[Resource::<{ids['traces']}.Arn>/{pattern}]": reason
            for pattern, reason in TRACES_KEYS.items()
        },
        f"AwsSolutions-IAM5[Resource::<{ids['tasksets']}.Arn>/*]": (
            "Prepare reads any task set by content-addressed key"
        ),
        **{
            f"AwsSolutions-IAM5[Resource::<{ids[fn]}.Arn>:*]": (
                "Step Functions invokes the function's versions and aliases"
            )
            for fn in ("prepare", "scorer", "recorder")
        },
    }


def _resources(stack: Stack) -> dict[str, CfnElement]:
    """The L1 resources whose logical ids appear in nag's granular finding ids."""

    def child(*path: str) -> CfnElement:
        node = stack.node
        for part in path:
            node = node.find_child(part).node
        element = node.default_child
        assert isinstance(element, CfnElement)
        return element

    return {
        "traces": child("Storage", "Traces"),
        "tasksets": child("Storage", "Tasksets"),
        "prepare": child("Prepare", "Function"),
        "scorer": child("Scorer", "Function"),
        "recorder": child("Recorder", "Function"),
    }


def suppress_known_findings(stack: Stack, rollout_logical_id: str) -> None:
    findings = acknowledged(stack)
    findings[
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:"
        '<AWS::AccountId>:execution:{"Fn::Select":[6,{"Fn::Split":[":",'
        f'{{"Ref":"{rollout_logical_id}"}}]}}]}}:*]'
    ] = "the dispatcher describes executions of the Rollout state machine it started"
    for rule_id, reason in findings.items():
        Validations.of(stack).acknowledge(Acknowledgment(id=rule_id, reason=reason))
