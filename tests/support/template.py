"""Reading the synthesized template in tests: resources by kind, the one resource of a kind,
and the state machine's definition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aws_cdk.assertions import Template

ROOT = Path(__file__).resolve().parents[2]


def resources(template: Template, kind: str) -> dict[str, Any]:
    return template.find_resources(kind)


def only(template: Template, kind: str, logical_prefix: str = "") -> tuple[str, dict[str, Any]]:
    """The one resource of `kind` whose logical id starts with `logical_prefix`: (id, resource)."""
    (found,) = [
        (k, r) for k, r in resources(template, kind).items() if k.startswith(logical_prefix)
    ]
    return found


def definition(template: Template, logical_prefix: str = "OrchestrationRollout") -> dict[str, Any]:
    """A state machine's definition: the Rollout's, unless another is named."""
    _, machine = only(template, "AWS::StepFunctions::StateMachine", logical_prefix)
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    # Intrinsics sit inside JSON strings: stand-ins of the right shape will do.
    return json.loads("".join(p if isinstance(p, str) else _stand_in(p) for p in parts))


def _stand_in(intrinsic: dict[str, Any]) -> str:
    if intrinsic.get("Ref") == "AWS::Partition":
        return "aws"
    if "Fn::GetAtt" in intrinsic:
        return f"arn:aws:lambda:us-east-1:000000000000:function:{intrinsic['Fn::GetAtt'][0]}"
    return "https://sqs.us-east-1.amazonaws.com/000000000000/work"
