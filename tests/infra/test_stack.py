"""Template assertions on one shared synth (validator off; cdk-nag on, as on every synth)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from trialbox import constants as c

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def template() -> Template:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ["CDK_VALIDATION"] = "false"
    sys.path.insert(0, str(ROOT))
    from app import build_app

    app = build_app(context={"aws:cdk:bundling-stacks": []})
    stack = app.node.find_child("Trialbox")
    return Template.from_stack(stack)  # type: ignore[arg-type]


def resources(template: Template, kind: str) -> dict[str, Any]:
    return template.find_resources(kind)


def definition(template: Template) -> dict[str, Any]:
    (machine,) = resources(template, "AWS::StepFunctions::StateMachine").values()
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    # Intrinsics sit inside JSON strings: stand-ins of the right shape will do.
    return json.loads("".join(p if isinstance(p, str) else _stand_in(p) for p in parts))


def _stand_in(intrinsic: dict[str, Any]) -> str:
    if intrinsic.get("Ref") == "AWS::Partition":
        return "aws"
    if "Fn::GetAtt" in intrinsic:
        return f"arn:aws:lambda:us-east-1:000000000000:function:{intrinsic['Fn::GetAtt'][0]}"
    return "https://sqs.us-east-1.amazonaws.com/000000000000/work"


def test_rollout_shape_retries_and_catches(template: Template) -> None:
    asl = definition(template)
    assert asl["StartAt"] == "Prepare"
    states = asl["States"]
    assert list(states) == ["Prepare", "Execute", "Score", "Record"]
    assert [states[s].get("Next") for s in ("Prepare", "Execute", "Score")] == [
        "Execute",
        "Score",
        "Record",
    ]
    execute = states["Execute"]
    assert execute["Resource"].endswith(":states:::sqs:sendMessage.waitForTaskToken")
    assert execute["HeartbeatSecondsPath"] == "$.job.heartbeat_s"
    assert execute["TimeoutSecondsPath"] == "$.job.timeout_s"
    assert execute["Retry"] == [
        {
            "ErrorEquals": ["States.HeartbeatTimeout", "States.Timeout"],
            "IntervalSeconds": 1,
            "MaxAttempts": 2,
            "BackoffRate": 2,
        }
    ]
    for name in ("Prepare", "Execute", "Score"):
        assert states[name]["Catch"] == [
            {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Record"}
        ]
    assert states["Record"]["End"] is True
    # Happy path transitions: Prepare, Execute, Score, Record.
    assert len(states) <= 6


def test_queues_have_dlqs_and_visibility_six_times_the_consumer(template: Template) -> None:
    queues = resources(template, "AWS::SQS::Queue")
    with_dlq = [q for q in queues.values() if "RedrivePolicy" in q["Properties"]]
    assert len(with_dlq) == 2
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    (dispatcher,) = [
        f
        for f in resources(template, "AWS::Lambda::Function").values()
        if f["Properties"]["Handler"] == "functions.dispatcher.handler.handler"
    ]
    timeout = dispatcher["Properties"]["Timeout"]
    visibilities = sorted(q["Properties"]["VisibilityTimeout"] for q in with_dlq)
    assert visibilities[0] >= 6 * timeout or visibilities[1] >= 6 * timeout
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {"FunctionResponseTypes": ["ReportBatchItemFailures"], "BatchSize": 10},
    )


def test_buckets_and_table_are_secure(template: Template) -> None:
    for bucket in resources(template, "AWS::S3::Bucket").values():
        props = bucket["Properties"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    policies = resources(template, "AWS::S3::BucketPolicy")
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in statements
        )
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {"LifecycleConfiguration": {"Rules": [Match.object_like({"ExpirationInDays": 30})]}},
    )
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": c.TABLE_KEY, "KeyType": "HASH"}],
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "TimeToLiveSpecification": {
                "AttributeName": c.TABLE_TTL_ATTRIBUTE,
                "Enabled": True,
            },
        },
    )


def test_worker_task_definition_is_locked_down(template: Template) -> None:
    (task,) = resources(template, "AWS::ECS::TaskDefinition").values()
    props = task["Properties"]
    assert props["RuntimePlatform"]["CpuArchitecture"] == "ARM64"
    (container,) = props["ContainerDefinitions"]
    assert container["ReadonlyRootFilesystem"] is True
    linux = container["LinuxParameters"]
    assert linux["InitProcessEnabled"] is True
    dropped = set(linux["Capabilities"]["Drop"])
    for kept in ("CHOWN", "FOWNER", "SETUID", "SETGID", "KILL"):
        assert kept not in dropped
    assert {"NET_RAW", "DAC_OVERRIDE", "SYS_CHROOT", "MKNOD", "SETPCAP"} <= dropped
    assert "User" not in container  # root, so it can drop each job to a per-slot uid
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env["TRIALBOX_SANDBOX_BACKEND"] == "rlimit"
    template.has_resource_properties(
        "AWS::ECS::Service",
        {
            "NetworkConfiguration": {
                "AwsvpcConfiguration": Match.object_like({"AssignPublicIp": "DISABLED"})
            }
        },
    )


def test_lambdas_are_arm64_with_powertools_and_explicit_logs(template: Template) -> None:
    functions = resources(template, "AWS::Lambda::Function")
    assert len(functions) == 4
    for function in functions.values():
        props = function["Properties"]
        assert props["Architectures"] == ["arm64"]
        assert props["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"].startswith("trialbox-")
        assert "LoggingConfig" in props and "LogGroup" in props["LoggingConfig"]


def test_outputs_have_stable_names(template: Template) -> None:
    outputs = template.find_outputs("*")
    for name in (
        c.OUTPUT_REQUESTS_QUEUE_URL,
        c.OUTPUT_WORK_QUEUE_URL,
        c.OUTPUT_TASKSETS_BUCKET,
        c.OUTPUT_TRACES_BUCKET,
        c.OUTPUT_EXECUTIONS_TABLE,
        c.OUTPUT_ROLLOUT_ARN,
    ):
        assert outputs[name]["Export"]["Name"] == f"Trialbox-{name}"


def test_bad_config_fails_synth_with_the_field_name() -> None:
    code = (
        "import sys; sys.path.insert(0, '.');"
        "from app import build_app;"
        "build_app(context={'trialbox': {'pool': {'cpu': 1024, 'memory_mb': 999}}})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "invalid cdk.json context:" in done.stderr
    assert (
        "trialbox.pool: Value error, pool.memory_mb 999 is not valid with cpu 1024" in done.stderr
    )


def test_cfn_lint_passes(template: Template, tmp_path: Path) -> None:
    path = tmp_path / "template.json"
    path.write_text(json.dumps(template.to_json()))
    done = subprocess.run(
        [Path(sys.executable).with_name("cfn-lint"), path, "--ignore-checks", "W3005", "W3010"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _walk(node: Any) -> list[tuple[str, Any]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append((key, value))
            found.extend(_walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_walk(value))
    return found


def test_asl_parses_in_moto_and_avoids_what_moto_mis_executes(template: Template) -> None:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    asl = definition(template)
    AmazonStateLanguageParser.parse(json.dumps(asl))  # raises on anything it cannot run
    pairs = _walk(asl)
    keys = {key for key, _ in pairs}
    assert "QueryLanguage" not in keys and "Assign" not in keys  # JSONata / variables fail
    assert ("ExecutionType", "EXPRESS") not in pairs  # rejected at create time
    paths = [v for k, v in pairs if isinstance(v, str) and (k.endswith("Path") or k.endswith(".$"))]
    assert paths and not [p for p in paths if "[" in p]  # $.a[0].b returns a list in moto
