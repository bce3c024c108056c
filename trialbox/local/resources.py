"""Create the template's resources in moto through the APIs, with the template's settings, and
evaluate intrinsics (Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select, Fn::Split) against them.
The template is never deployed into moto's CloudFormation (research/local-aws.md says why)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trialbox.local import limits

ACCOUNT = "123456789012"
REGION = "us-east-1"


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    handler: str  # "functions.<name>.handler.handler"
    environment: dict[str, str]
    timeout_s: float = 3.0  # Lambda's default, as CloudFormation's
    reserved: int | None = None  # ReservedConcurrentExecutions: at most this many at once


@dataclass(frozen=True)
class EventSourceMapping:
    queue_url: str
    function: str
    batch_size: int
    report_batch_item_failures: bool
    # ScalingConfig.MaximumConcurrency: at most this many of its invocations at once; None:
    # Lambda's own scaling, unbounded by the mapping.
    max_concurrency: int | None = None


@dataclass(frozen=True)
class Schedule:
    """An EventBridge rule's `rate(...)` schedule with a function target."""

    rule: str
    function: str
    every_s: float


# The queue settings the twin's SQS takes from the template (SQS's defaults otherwise).
QUEUE_ATTRIBUTES = (
    "VisibilityTimeout",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
)
DEFAULT_VISIBILITY_S = 30  # SQS's, when the template sets none


RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
RATE_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}


def rate_s(expression: str) -> float:
    """`rate(5 minutes)` in seconds (the twin runs no cron expressions)."""
    match = RATE.match(expression)
    if match is None:
        raise ValueError(f"the twin runs rate(...) schedules only, not {expression!r}")
    return int(match.group(1)) * RATE_UNIT_S[match.group(2).rstrip("s")]


@dataclass
class LocalStack:
    outputs: dict[str, str] = field(default_factory=dict)
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    mappings: list[EventSourceMapping] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    task_definition: dict[str, Any] = field(default_factory=dict)  # the pool's: family, memory_mb
    service: str = ""  # the pool's ECS service (its ARN)
    state_machines: dict[str, str] = field(default_factory=dict)  # logical id -> arn


class Resolver:
    def __init__(self, template: dict[str, Any]) -> None:
        self.resources: dict[str, Any] = template["Resources"]
        self.physical: dict[str, dict[str, str]] = {}
        for logical, resource in self.resources.items():
            self.physical[logical] = self._names(logical, resource)

    @staticmethod
    def _names(logical: str, resource: dict[str, Any]) -> dict[str, str]:
        kind = resource["Type"]
        if kind == "AWS::SQS::Queue":
            url = f"http://sqs.{REGION}.localhost.localstack.cloud/{ACCOUNT}/{logical}"
            arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{logical}"
            return {"Ref": url, "Arn": arn, "QueueName": logical, "QueueUrl": url}
        if kind == "AWS::S3::Bucket":
            name = logical.lower()[:63]
            return {"Ref": name, "Arn": f"arn:aws:s3:::{name}"}
        if kind == "AWS::DynamoDB::Table":
            arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{logical}"
            return {"Ref": logical, "Arn": arn}
        if kind == "AWS::Lambda::Function":
            arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{logical}"
            return {"Ref": logical, "Arn": arn}
        if kind == "AWS::ECS::Cluster":
            return {"Ref": logical, "Arn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{logical}"}
        if kind == "AWS::ECS::Service":  # Ref: its ARN, as CloudFormation's (the long format)
            cluster = resource["Properties"]["Cluster"]["Ref"]
            arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:service/{cluster}/{logical}"
            return {"Ref": arn, "Arn": arn, "Name": logical}
        if kind == "AWS::StepFunctions::StateMachine":
            # Its StateMachineName when the template gives one (a plain string), as CloudFormation.
            name = resource.get("Properties", {}).get("StateMachineName", logical)
            arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{name}"
            return {"Ref": arn, "Arn": arn, "Name": name}
        return {"Ref": f"local-{logical}", "Arn": f"arn:aws:local:{REGION}:{ACCOUNT}:{logical}"}

    def set_queue_url(self, logical: str, url: str) -> None:
        self.physical[logical]["Ref"] = self.physical[logical]["QueueUrl"] = url

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) != 1:
            return {k: self.resolve(v) for k, v in value.items()}
        ((key, arg),) = value.items()
        if key == "Ref":
            return self._ref(arg)
        if key == "Fn::GetAtt":
            logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self.physical[logical].get(attribute, self.physical[logical]["Arn"])
        if key == "Fn::Join":
            separator, parts = arg
            return separator.join(str(self.resolve(p)) for p in parts)
        if key == "Fn::Select":
            index, items = arg
            return self.resolve(items)[int(index)]
        if key == "Fn::Split":
            separator, text = arg
            return str(self.resolve(text)).split(separator)
        if key == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else arg
            values = {k: str(self.resolve(v)) for k, v in variables.items()}
            return re.sub(
                r"\$\{([^}]+)\}",
                lambda m: values.get(m.group(1)) or str(self._ref(m.group(1))),
                text,
            )
        return {key: self.resolve(arg)}

    def _ref(self, name: str) -> str:
        pseudo = {
            "AWS::Partition": "aws",
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": "Trialbox",
        }
        if name in pseudo:
            return pseudo[name]
        if "." in name:
            logical, attribute = name.split(".", 1)
            return self.physical[logical].get(attribute, self.physical[logical]["Arn"])
        return self.physical[name]["Ref"]


def create(
    template: dict[str, Any],
    clients: dict[str, Any],
    function_url: Callable[[str], str] | None = None,
) -> LocalStack:
    """`function_url(function)`: where the twin serves a function's URL (None: nowhere)."""
    resolver = Resolver(template)
    resources = resolver.resources
    stack = LocalStack()
    by_type: dict[str, list[str]] = {}
    for logical, resource in resources.items():
        by_type.setdefault(resource["Type"], []).append(logical)

    for logical in by_type.get("AWS::S3::Bucket", []):
        name = resolver.physical[logical]["Ref"]
        clients["s3"].create_bucket(Bucket=name)
        props = resources[logical].get("Properties", {})
        if props.get("VersioningConfiguration", {}).get("Status") == "Enabled":
            clients["s3"].put_bucket_versioning(
                Bucket=name, VersioningConfiguration={"Status": "Enabled"}
            )

    # Dead-letter queues first: a redrive policy names its DLQ's ARN.
    queues = sorted(
        by_type.get("AWS::SQS::Queue", []),
        key=lambda q: "RedrivePolicy" in resources[q].get("Properties", {}),
    )
    for logical in queues:
        props = resources[logical].get("Properties", {})
        attributes = {name: str(props[name]) for name in QUEUE_ATTRIBUTES if name in props}
        if "RedrivePolicy" in props:
            attributes["RedrivePolicy"] = json.dumps(resolver.resolve(props["RedrivePolicy"]))
        url = clients["sqs"].create_queue(QueueName=logical, Attributes=attributes)["QueueUrl"]
        resolver.set_queue_url(logical, url)

    for logical in by_type.get("AWS::DynamoDB::Table", []):
        props = resources[logical]["Properties"]
        clients["dynamodb"].create_table(
            TableName=logical,
            KeySchema=props["KeySchema"],
            AttributeDefinitions=props["AttributeDefinitions"],
            BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
        )
        ttl = props.get("TimeToLiveSpecification")
        if ttl:
            clients["dynamodb"].update_time_to_live(
                TableName=logical,
                TimeToLiveSpecification={"AttributeName": ttl["AttributeName"], "Enabled": True},
            )

    # The pool's cluster and task definition: the twin's workers run as its tasks
    # (trialbox.local.tasks), so that ECS says why one stopped, as on AWS.
    for logical in by_type.get("AWS::ECS::Cluster", []):
        clients["ecs"].create_cluster(clusterName=resolver.physical[logical]["Ref"])
    for logical in by_type.get("AWS::ECS::TaskDefinition", []):
        props = resources[logical]["Properties"]
        containers = [  # the whole task's memory each: the template sets it per task
            {"name": c["Name"], "image": "trialbox-worker:local", "memory": int(props["Memory"])}
            for c in props["ContainerDefinitions"]
        ]
        clients["ecs"].register_task_definition(  # "host": the twin's workers share its network
            family=props["Family"],
            containerDefinitions=containers,
            networkMode="host",
            cpu=str(props["Cpu"]),
            memory=str(props["Memory"]),
        )
        stack.task_definition = {"family": props["Family"], "memory_mb": int(props["Memory"])}
    # The pool's service, whose desired count the scaler sets (an elastic twin's pool follows
    # it: trialbox.local.twin). With no DesiredCount, CloudFormation creates it with 1 task.
    for logical in by_type.get("AWS::ECS::Service", []):
        props = resources[logical]["Properties"]
        clients["ecs"].create_service(
            cluster=resolver.resolve(props["Cluster"]),
            serviceName=resolver.physical[logical]["Name"],
            taskDefinition=stack.task_definition["family"],
            desiredCount=int(props.get("DesiredCount", 1)),
            launchType="FARGATE",
        )
        stack.service = resolver.physical[logical]["Ref"]

    for logical in by_type.get("AWS::Lambda::Function", []):
        props = resources[logical]["Properties"]
        if not props["Handler"].startswith("functions."):
            continue  # a deploy-time custom resource's provider (the S3 prefix list lookup)
        env = resolver.resolve(props.get("Environment", {}).get("Variables", {}))
        reserved = props.get("ReservedConcurrentExecutions")
        stack.functions[logical] = FunctionSpec(
            logical, props["Handler"], env, float(props.get("Timeout", 3)),
            None if reserved is None else int(reserved),
        )  # fmt: skip

    for logical in by_type.get("AWS::StepFunctions::StateMachine", []):
        props = resources[logical]["Properties"]
        definition = resolver.resolve(props["DefinitionString"])
        for key, value in resolver.resolve(props.get("DefinitionSubstitutions", {})).items():
            definition = definition.replace(f"${{{key}}}", str(value))
        arn = clients["stepfunctions"].create_state_machine(
            name=resolver.physical[logical]["Name"],
            definition=definition,
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/{logical}",
            type=props.get("StateMachineType", "STANDARD"),
        )["stateMachineArn"]
        stack.state_machines[logical] = arn

    for logical in by_type.get("AWS::Lambda::EventSourceMapping", []):
        props = resources[logical]["Properties"]
        queue_arn = resolver.resolve(props["EventSourceArn"])
        queue = next(q for q in queues if resolver.physical[q]["Arn"] == queue_arn)
        consumer = str(resolver.resolve(props["FunctionName"]))
        visibility = resources[queue].get("Properties", {}).get("VisibilityTimeout")
        limits.check_event_source_mapping(
            logical,
            float(DEFAULT_VISIBILITY_S if visibility is None else visibility),
            consumer,
            stack.functions[consumer].timeout_s if consumer in stack.functions else 3.0,
        )
        stack.mappings.append(
            EventSourceMapping(
                queue_url=resolver.physical[queue]["QueueUrl"],
                function=consumer,
                batch_size=int(props.get("BatchSize", 10)),
                report_batch_item_failures="ReportBatchItemFailures"
                in props.get("FunctionResponseTypes", []),
                max_concurrency=_max_concurrency(props),
            )
        )

    arns = {resolver.physical[f]["Arn"]: f for f in stack.functions}
    for logical in by_type.get("AWS::Lambda::Url", []):
        target = arns[resolver.resolve(resources[logical]["Properties"]["TargetFunctionArn"])]
        url = function_url(target) if function_url else f"http://function-url.invalid/{target}/"
        resolver.physical[logical]["FunctionUrl"] = url
    for logical in by_type.get("AWS::Events::Rule", []):
        props = resources[logical]["Properties"]
        if "ScheduleExpression" not in props or props.get("State") == "DISABLED":
            continue
        for target in props.get("Targets", []):
            function = arns.get(resolver.resolve(target["Arn"]))
            if function is not None:
                stack.schedules.append(
                    Schedule(logical, function, rate_s(props["ScheduleExpression"]))
                )

    stack.outputs = {
        name: str(resolver.resolve(output["Value"]))
        for name, output in template.get("Outputs", {}).items()
    }
    return stack


def _max_concurrency(props: dict[str, Any]) -> int | None:
    found = props.get("ScalingConfig", {}).get("MaximumConcurrency")
    return None if found is None else int(found)
