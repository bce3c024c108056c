"""Template assertions on one shared synth (validator off; cdk-nag on, as on every synth)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from infra.config import StackConfig
from tests.support.template import ROOT, definition, only, resources
from trialbox import constants as c
from trialbox.integrations.sandbox_fusion import FUNCTION_TIMEOUT_S, RUN_CODE_TASK
from trialbox.models.sessions import OPEN_TIMEOUT_S
from trialbox.settings import work_visibility_s
from trialbox.worker.metrics import held_sessions_line


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return dict(json.loads((ROOT / "cdk.json").read_text())["context"]["trialbox"])


def one(template: Template, kind: str, logical_prefix: str) -> dict[str, Any]:
    return only(template, kind, logical_prefix)[1]


def test_rollout_shape_retries_and_catches(template: Template) -> None:
    asl = definition(template)
    assert asl["StartAt"] == "Prepare"
    states = asl["States"]
    assert set(states) == {
        "Prepare",
        "Execute",
        "Record",
        "DescribeRecordFailure",
        "RecordFailed",
        "AlreadyRecorded",
        "WasItTaken",
        "Taken",
        "WaitedTooLong",
        "CountWait",
        "NeverTaken",
        "RetriesLeft",
        "ClearTaker",
        "CountLost",
    }
    # Record scores the run the worker answered: no Score step between.
    assert [states[s].get("Next") for s in ("Prepare", "Execute")] == ["Execute", "Record"]
    execute = states["Execute"]
    assert execute["Resource"].endswith(":states:::sqs:sendMessage.waitForTaskToken")
    assert execute["HeartbeatSecondsPath"] == "$.job.heartbeat_s"
    assert execute["TimeoutSecondsPath"] == "$.job.timeout_s"
    # The worker learns which attempt it runs; the result counts them (1 + the lost ones).
    assert execute["Parameters"]["MessageBody"] == {
        "task_token.$": "$$.Task.Token",
        "request_id.$": "$.request_id",
        "job_uri.$": "$.job.job_uri",
        "attempt.$": "$.job.attempt",
    }
    # A lapsed clock is not retried blindly: the admission marker says whether any worker
    # took the job (a lost sandbox, counted) or none did (sent again, uncounted).
    assert "Retry" not in execute
    to_record = {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Record"}
    lost = ["States.HeartbeatTimeout", "States.Timeout", "Sandbox.Interrupted"]
    assert execute["Catch"] == [
        {"ErrorEquals": lost, "ResultPath": "$.error", "Next": "WasItTaken"},
        to_record,
    ]
    assert states["Prepare"]["Catch"] == [to_record]
    check = states["WasItTaken"]
    assert check["Resource"].endswith(":states:::dynamodb:getItem")
    assert check["Parameters"]["ConsistentRead"] is True
    assert check["Parameters"]["Key"] == {
        "part": {"S.$": "$.job.admission_part"},
        "id": {"S.$": "$.request_id"},
    }
    # A marker it cannot read is a lost sandbox's retry, never a result with no retry.
    assert check["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.admission_error", "Next": "RetriesLeft"}
    ]
    assert check["Parameters"]["ProjectionExpression"] == "taken_by,lost"
    [waiting] = states["Taken"]["Choices"]
    # Only a marker no worker took, and that the reaper did not find lost, is a wait.
    assert waiting == {
        "And": [
            {"Variable": "$.admission.Item", "IsPresent": True},
            {"Variable": "$.admission.Item.taken_by", "IsPresent": False},
            {"Variable": "$.admission.Item.lost", "IsPresent": False},
        ],
        "Next": "WaitedTooLong",
    }
    assert states["Taken"]["Default"] == "RetriesLeft"
    [retry] = states["RetriesLeft"]["Choices"]
    assert retry == {"Variable": "$.job.attempt", "NumericLessThan": 2, "Next": "ClearTaker"}
    assert states["RetriesLeft"]["Default"] == "Record"
    # A lost sandbox is counted once: its retry's marker names no taker (red team 25).
    clear = states["ClearTaker"]
    assert clear["Resource"].endswith(":states:::dynamodb:updateItem")
    assert clear["Parameters"]["UpdateExpression"] == "REMOVE taken_by, lost"
    assert clear["Parameters"]["ConditionExpression"] == "attribute_exists(id)"
    assert clear["Next"] == "CountLost"
    assert clear["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.admission_error", "Next": "CountLost"}
    ]
    for count in ("CountLost", "CountWait"):
        assert states[count]["Next"] == "Execute"
    assert states["Record"]["End"] is True
    # Even a failing Record leaves a terminal result: a conditional put of a sandbox_error.
    assert states["Record"]["Catch"] == [
        {
            "ErrorEquals": ["States.ALL"],
            "ResultPath": "$.record_error",
            "Next": "DescribeRecordFailure",
        }
    ]
    fallback = states["RecordFailed"]
    assert fallback["Resource"].endswith(":states:::dynamodb:putItem")
    assert fallback["Parameters"]["ConditionExpression"] == "attribute_not_exists(request_id)"
    assert fallback["Parameters"]["Item"]["status"] == {"S": "sandbox_error"}
    assert fallback["Catch"][0]["ErrorEquals"] == ["DynamoDB.ConditionalCheckFailedException"]
    happy, name = [], asl["StartAt"]
    while name:  # the states an execution with no error enters, each one transition
        happy.append(name)
        name = states[name].get("Next")
    assert happy == ["Prepare", "Execute", "Record"]
    for name in ("Prepare", "Record"):
        throttled = [r for r in states[name]["Retry"] if "TooManyRequests" in str(r)]
        assert throttled and throttled[0]["ErrorEquals"] == ["Lambda.TooManyRequestsException"]


def test_queues_have_dlqs_and_visibility_six_times_the_consumer(
    template: Template, config: dict[str, Any]
) -> None:
    queues = resources(template, "AWS::SQS::Queue")
    with_dlq = [q for q in queues.values() if "RedrivePolicy" in q["Properties"]]
    assert len(with_dlq) == 3 and len(queues) == 7  # requests, work, finish; DLQs; opens
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    dispatcher = one(template, "AWS::Lambda::Function", "DispatcherFunction")
    requests = one(template, "AWS::SQS::Queue", "IntakeRequestsQueue")["Properties"]
    assert requests["VisibilityTimeout"] >= 6 * dispatcher["Properties"]["Timeout"]
    assert "RedrivePolicy" in requests
    # The worker holds a job for 3 heartbeats at a time and extends it on every heartbeat
    # (test_settings_agree: the queue's visibility is the one the worker asks for).
    work = one(template, "AWS::SQS::Queue", "PoolWorkQueue")["Properties"]
    assert work["VisibilityTimeout"] == work_visibility_s(config["heartbeat_s"])
    assert "RedrivePolicy" in work
    finisher = one(template, "AWS::Lambda::Function", "FinisherFunction")
    finish = one(template, "AWS::SQS::Queue", "FinishQueue")["Properties"]
    assert finish["VisibilityTimeout"] >= 6 * finisher["Properties"]["Timeout"]
    assert "RedrivePolicy" in finish
    # Sessions' opens: kept as long as a client waits for one, so none is hosted after its
    # client gave up; no DLQ (an open nobody took is its client's timeout to report).
    opens = one(template, "AWS::SQS::Queue", "PoolOpensQueue")["Properties"]
    assert opens["MessageRetentionPeriod"] == OPEN_TIMEOUT_S
    assert "RedrivePolicy" not in opens
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
    assert len(policies) == len(resources(template, "AWS::S3::Bucket")) == 3
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
    # tests/fargate shows a job failing without each of these.
    kept = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"}
    docker_defaults = kept | {"FSETID", "SETFCAP", "SETPCAP", "NET_RAW"}
    docker_defaults |= {"NET_BIND_SERVICE", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE"}
    assert docker_defaults - kept <= dropped and not kept & dropped and "ALL" not in dropped
    assert set(linux["Capabilities"].get("Add", [])) <= {"SYS_PTRACE"}  # all Fargate accepts
    # Two scratch volumes on the read-only root: slot state and /tmp never share a directory.
    assert {v["Name"] for v in props["Volumes"]} == {"state", "tmp"}
    mounts = {m["ContainerPath"]: m["SourceVolume"] for m in container["MountPoints"]}
    assert mounts == {"/var/lib/trialbox": "state", "/tmp": "tmp"}
    assert container["StopTimeout"] == 120
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


class _CloudWatch:
    """Records the HeldSessions query the scaler makes."""

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []

    def get_metric_data(self, **kwargs: Any) -> dict[str, Any]:
        self.queries += kwargs["MetricDataQueries"]
        return {"MetricDataResults": [{"Id": "held", "Values": [2.0, 5.0]}]}


def test_the_scaler_reads_both_queues_the_count_and_the_workers_held_sessions(
    template: Template,
) -> None:
    """Admission starts executions only for live slots: with no worker (a warm minimum of 0)
    the whole backlog is in the requests queue, so the scaler must read it, or nothing ever
    starts a worker. And it reads the held sessions the workers write, under the Pool name the
    task definition gives them."""
    from trialbox.pipeline.scaler import DemandReader
    from trialbox.settings import FunctionSettings

    (scaler,) = [
        f["Properties"]
        for f in resources(template, "AWS::Lambda::Function").values()
        if f["Properties"]["Handler"] == "functions.scaler.handler.handler"
    ]
    env = scaler["Environment"]["Variables"]
    requests, _ = only(template, "AWS::SQS::Queue", "IntakeRequestsQueue")
    work, _ = only(template, "AWS::SQS::Queue", "PoolWorkQueue")
    table, _ = only(template, "AWS::DynamoDB::Table", "StorageAdmission")
    cluster, _ = only(template, "AWS::ECS::Cluster")
    assert env[c.ENV_REQUESTS_QUEUE_URL] == {"Ref": requests}
    assert env[c.ENV_WORK_QUEUE_URL] == {"Ref": work}
    assert env[c.ENV_ADMISSION_TABLE] == {"Ref": table}
    assert env[c.ENV_CLUSTER] == {"Ref": cluster}
    (task,) = resources(template, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    worker_env = {e["Name"]: e["Value"] for e in container["Environment"]}
    pool = FunctionSettings.from_env(
        {k: v for k, v in env.items() if isinstance(v, str)}
        | {c.ENV_TASKSETS_BUCKET: "t", c.ENV_TRACES_BUCKET: "t"}
    ).pool_name
    assert pool == worker_env[c.ENV_POOL_NAME]
    cloudwatch = _CloudWatch()
    reader = DemandReader(
        sqs=None,
        cloudwatch=cloudwatch,
        admission=None,  # type: ignore[arg-type]
        requests_queue_url="",
        work_queue_url="",
        open_queue_url="",
        pool_name=pool,
    )
    assert reader.held(1_700_000_000) == 5  # the largest minute's sum over the workers
    ((query,),) = [cloudwatch.queries]
    metric = query["MetricStat"]["Metric"]
    line = json.loads(held_sessions_line(worker_env[c.ENV_POOL_NAME], 3))
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    assert (metric["Namespace"], [[d["Name"] for d in metric["Dimensions"]]]) == (
        directive["Namespace"],
        directive["Dimensions"],
    )
    assert metric["MetricName"] == c.METRIC_HELD_SESSIONS in line
    assert metric["Dimensions"] == [{"Name": c.DIMENSION_POOL, "Value": line[c.DIMENSION_POOL]}]
    assert query["MetricStat"]["Stat"] == "Sum"


def test_each_role_reaches_only_its_own_objects(template: Template) -> None:
    def grants(prefix: str) -> dict[str, set[str]]:
        policy = one(template, "AWS::IAM::Policy", prefix)["Properties"]["PolicyDocument"]
        found: dict[str, set[str]] = {"read": set(), "put": set()}
        for statement in policy["Statement"]:
            actions = json.dumps(statement["Action"])
            kinds = [
                k for k, a in (("put", "s3:PutObject"), ("read", "s3:GetObject")) if a in actions
            ]
            for kind in kinds:
                for resource in (
                    statement["Resource"]
                    if isinstance(statement["Resource"], list)
                    else [statement["Resource"]]
                ):
                    joined = resource.get("Fn::Join", ["", []])[1]
                    if joined and "StorageTraces" in json.dumps(joined[0]):
                        found[kind].add(joined[1])
        return found

    assert grants("PoolWorkerTaskRole") == {
        "read": {"/jobs/*/job.json", "/checkpoints/*"},
        "put": {"/jobs/*/report.json", "/checkpoints/*", "/sessions/*"},
    }
    # A raw sender's large inline request: stored as the SDK stores one.
    assert grants("DispatcherRole") == {
        "read": {"/payloads/*"},
        "put": {"/payloads/*", "/batches/*"},  # and a batch's requests
    }
    assert grants("PrepareRole") == {
        "read": {"/payloads/*", "/checkpoints/*"},
        "put": {"/jobs/*/job.json"},
    }
    # Record scores the run (its job and the worker's report), and writes the trace.
    assert grants("RecorderRole") == {
        "read": {"/jobs/*/job.json", "/jobs/*/report.json"},
        "put": {"/traces/*"},
    }
    # A batch's: Run prepares (and records a rejected sample), Settle and the finisher record.
    assert grants("BatchRole") == {
        "read": {"/batches/*", "/payloads/*", "/checkpoints/*"},
        "put": {"/jobs/*/job.json", "/traces/*"},
    }
    assert grants("SettleRole") == {"read": set(), "put": {"/traces/*"}}
    assert grants("FinisherRole") == {
        "read": {"/jobs/*/job.json", "/jobs/*/report.json"},
        "put": {"/traces/*"},
    }
    # One conditional PutItem per result; the dispatcher also reads whether a request ended.
    executions, _ = only(template, "AWS::DynamoDB::Table", "StorageExecutions")
    expected = {"DispatcherRole": ["dynamodb:PutItem", "dynamodb:GetItem"]}
    for role in ("DispatcherRole", "RecorderRole"):
        policy = one(template, "AWS::IAM::Policy", role)["Properties"]["PolicyDocument"]
        table = [
            s["Action"]
            for s in policy["Statement"]
            if "dynamodb" in json.dumps(s["Action"]) and executions in json.dumps(s["Resource"])
        ]
        assert table == expected.get(role, ["dynamodb:PutItem"])


def test_the_staged_image_asset_holds_its_dockerfile(app: cdk.App) -> None:
    assembly = Path(app.synth().directory)
    manifest = json.loads((assembly / "Trialbox.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    staged = assembly / image["source"]["directory"]
    assert (staged / image["source"]["dockerFile"]).is_file()
    assert (staged / "sandbox_image" / "requirements.txt").is_file()
    assert (staged / "trialbox" / "worker" / "__main__.py").is_file()
    assert not (staged / "tests").exists() and not (staged / ".venv").exists()


def test_lambdas_are_arm64_with_powertools_and_explicit_logs(template: Template) -> None:
    functions = {  # the pipeline's; the S3 prefix list lookup's provider: tests/infra/test_egress
        k: f
        for k, f in resources(template, "AWS::Lambda::Function").items()
        if f["Properties"]["Handler"].startswith("functions.")
    }
    assert len(functions) == 10
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
        c.OUTPUT_POOL_CAPACITY,
        c.OUTPUT_RUN_CODE_URL,
    ):
        assert outputs[name]["Export"]["Name"] == f"Trialbox-{name}"


def test_run_code_is_a_function_url_with_iam_auth_that_the_client_policy_may_call(
    template: Template,
) -> None:
    (url,) = resources(template, "AWS::Lambda::Url").values()
    assert url["Properties"]["AuthType"] == "AWS_IAM"  # never a public URL
    function_id = url["Properties"]["TargetFunctionArn"]["Fn::GetAtt"][0]
    function = resources(template, "AWS::Lambda::Function")[function_id]["Properties"]
    assert function["Handler"] == "functions.run_code.handler.handler"
    # Lambda's timeout bounds a call; the handler answers 504 a second before it (the
    # endpoint reads its remaining time), and a call's run fits in it.
    assert function["Timeout"] == FUNCTION_TIMEOUT_S > RUN_CODE_TASK.limits.timeout_s + 10
    context = json.loads((ROOT / "cdk.json").read_text())["context"]["trialbox"]
    config = StackConfig.from_context(context)
    assert function["ReservedConcurrentExecutions"] == config.run_code_concurrency
    (policy,) = resources(template, "AWS::IAM::ManagedPolicy").values()
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    target = {"Fn::GetAtt": [function_id, "Arn"]}
    invoke_url = statements["RunCodeUrl"]
    assert (invoke_url["Action"], invoke_url["Resource"]) == ("lambda:InvokeFunctionUrl", target)
    assert invoke_url["Condition"] == {"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}
    invoke = statements["RunCodeInvoke"]
    assert (invoke["Action"], invoke["Resource"]) == ("lambda:InvokeFunction", target)


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
    assert "trialbox.pool: pool.memory_mb 999 is not valid with cpu 1024" in done.stderr


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


@pytest.mark.parametrize("machine", ["OrchestrationRollout", "BatchOrchestrationBatch"])
def test_asl_parses_in_moto_and_avoids_what_moto_mis_executes(
    template: Template, machine: str
) -> None:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    asl = definition(template, machine)
    AmazonStateLanguageParser.parse(json.dumps(asl))  # raises on anything it cannot run
    pairs = _walk(asl)
    keys = {key for key, _ in pairs}
    assert "QueryLanguage" not in keys and "Assign" not in keys  # JSONata / variables fail
    assert ("ExecutionType", "EXPRESS") not in pairs  # rejected at create time
    paths = [v for k, v in pairs if isinstance(v, str) and (k.endswith("Path") or k.endswith(".$"))]
    assert paths and not [p for p in paths if "[" in p]  # $.a[0].b returns a list in moto


def test_queues_and_the_rollout_have_alarms(template: Template) -> None:
    alarms = [a["Properties"] for a in resources(template, "AWS::CloudWatch::Alarm").values()]

    def watched(metric: str) -> set[str]:
        return {
            json.dumps(d["Value"])
            for a in alarms
            if a.get("MetricName") == metric
            for d in a.get("Dimensions", [])
        }

    queues = resources(template, "AWS::SQS::Queue")
    redrives = [q["Properties"].get("RedrivePolicy") for q in queues.values()]
    dlqs = {k for k in queues if any(k in json.dumps(r) for r in redrives if r)}
    sources = set(queues) - dlqs
    dlq_watched = watched("ApproximateNumberOfMessagesVisible")
    age_watched = watched("ApproximateAgeOfOldestMessage")
    for dlq in dlqs:
        assert any(dlq in value for value in dlq_watched), dlq
    for queue in sources:
        assert any(queue in value for value in age_watched), queue
    failed = [a for a in alarms if a.get("MetricName") == "ExecutionsFailed"]
    assert len(failed) == 2  # the Rollout's and the Batch's
    assert {(a["Threshold"], a["Namespace"]) for a in failed} == {(1, "AWS/States")}


ROGUE = """
import sys; sys.path.insert(0, '.')
from aws_cdk import aws_iam as iam
from app import build_app
app = build_app(context={'aws:cdk:bundling-stacks': []}, outdir=sys.argv[1])
stack = app.node.find_child('Trialbox')
role = iam.Role(stack, 'Rogue', assumed_by=iam.ServicePrincipal('lambda.amazonaws.com'))
role.add_to_policy(iam.PolicyStatement(actions=['xray:PutTraceSegments'], resources=['*']))
app.synth()
"""


def test_an_acknowledgement_covers_only_its_own_construct(tmp_path: Path) -> None:
    """The functions' `Resource::*` acknowledgement must not excuse a new role elsewhere."""
    done = subprocess.run(
        [sys.executable, "-c", ROGUE, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"CDK_VALIDATION": "false"},
    )
    assert done.returncode != 0
    assert "Trialbox/Rogue/DefaultPolicy/Resource" in done.stdout + done.stderr
    assert "AwsSolutions-IAM5[Resource::*]" in done.stdout + done.stderr
