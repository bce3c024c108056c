"""Each principal's statements in the synthesized template, resolved to the twin's ARNs.

A principal is found from the template, never from a list of today's resources: every Lambda
function's role, the ECS task definitions' task roles, the state machines' roles, and the
customer managed policy the stack outputs for trainers. A role's statements are those of every
`AWS::IAM::Policy` and `AWS::IAM::ManagedPolicy` attached to it, plus its inline policies.
Intrinsics are evaluated by the twin's own resolver, which names each resource as the twin
creates it.
"""

from __future__ import annotations

from typing import Any

from tests.iam.checker import Principal, Statement
from trialbox import constants as c
from trialbox.local import principals as keys
from trialbox.local.resources import Resolver

WORKER = "pool worker"
STATE_MACHINES = "state machines"
SDK = "SDK and CLI"


class UnsupportedPolicy(Exception):
    pass


def _logical(value: Any, what: str) -> str:
    """The logical id a role or policy property points at: {"Fn::GetAtt": [id, "Arn"]} or
    {"Ref": id}."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        target = value["Fn::GetAtt"]
        return str(target[0] if isinstance(target, list) else target.split(".", 1)[0])
    if isinstance(value, dict) and "Ref" in value:
        return str(value["Ref"])
    raise UnsupportedPolicy(f"{what}: {value!r} is not a role in this template")


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class TemplatePolicies:
    def __init__(self, template: dict[str, Any]) -> None:
        self.resources: dict[str, Any] = template["Resources"]
        self.outputs: dict[str, Any] = template.get("Outputs", {})
        self.resolver = Resolver(template)

    def _of_type(self, kind: str) -> list[str]:
        return [k for k, r in self.resources.items() if r["Type"] == kind]

    def _statements(self, document: dict[str, Any], source: str) -> list[Statement]:
        found = []
        for raw in _listed(document.get("Statement", [])):
            unsupported = {"NotAction", "NotResource", "NotPrincipal"} & set(raw)
            if unsupported:
                raise UnsupportedPolicy(f"{source}: {sorted(unsupported)} is not checked")
            resources = self.resolver.resolve(_listed(raw.get("Resource", [])))
            for resource in resources:
                if not isinstance(resource, str):
                    raise UnsupportedPolicy(f"{source}: cannot resolve resource {resource!r}")
            found.append(
                Statement(
                    effect=raw["Effect"],
                    actions=tuple(_listed(raw["Action"])),
                    resources=tuple(resources),
                    source=source,
                )
            )
        return found

    def role(self, role: str) -> list[Statement]:
        """Every statement that applies to role `role` (a logical id)."""
        if self.resources.get(role, {}).get("Type") != "AWS::IAM::Role":
            raise UnsupportedPolicy(f"{role} is not an AWS::IAM::Role of this template")
        props = self.resources[role].get("Properties", {})
        statements: list[Statement] = []
        for inline in props.get("Policies", []):
            statements += self._statements(inline["PolicyDocument"], f"{role} (inline)")
        for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for policy in self._of_type(kind):
                policy_props = self.resources[policy]["Properties"]
                attached = [_logical(r, policy) for r in policy_props.get("Roles", [])]
                if role in attached:
                    statements += self._statements(policy_props["PolicyDocument"], policy)
        for arn in props.get("ManagedPolicyArns", []):
            policy = _logical(arn, f"{role}'s ManagedPolicyArns")
            statements += self.managed_policy(policy)
        return statements

    def managed_policy(self, policy: str) -> list[Statement]:
        resource = self.resources.get(policy, {})
        if resource.get("Type") != "AWS::IAM::ManagedPolicy":
            raise UnsupportedPolicy(f"{policy} is not a customer managed policy of this template")
        return self._statements(resource["Properties"]["PolicyDocument"], policy)

    def principals(self) -> dict[str, Principal]:
        """By access key id (trialbox.local.principals): who the twin's callers stand for."""
        found: dict[str, Principal] = {}
        for function in self._of_type("AWS::Lambda::Function"):
            role = _logical(self.resources[function]["Properties"]["Role"], function)
            found[keys.function(function)] = Principal(f"function {function}", self.role(role))
        # The twin's workers share one key, as the task definitions share nothing else: a
        # template with more than one task definition checks their calls against all of them.
        workers = Principal(WORKER)
        for task in self._of_type("AWS::ECS::TaskDefinition"):
            props = self.resources[task]["Properties"]
            if "TaskRoleArn" in props:
                workers.statements += self.role(_logical(props["TaskRoleArn"], task))
        found[keys.WORKER] = workers
        # moto's interpreter signs every state machine's calls with one key: likewise.
        machines = Principal(STATE_MACHINES)
        for machine in self._of_type("AWS::StepFunctions::StateMachine"):
            props = self.resources[machine]["Properties"]
            machines.statements += self.role(_logical(props["RoleArn"], machine))
        found[keys.STATE_MACHINES] = machines
        output = self.outputs.get(c.OUTPUT_CLIENT_POLICY_ARN)
        if output is None:
            raise UnsupportedPolicy(f"the template has no {c.OUTPUT_CLIENT_POLICY_ARN} output")
        policy = _logical(output["Value"], c.OUTPUT_CLIENT_POLICY_ARN)
        found[keys.SDK] = Principal(SDK, self.managed_policy(policy))
        return found
