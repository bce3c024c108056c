"""Deploying for real: the service's deployment and its scaler, the alarm topic and its alarms, the
version output, and the README's idle cost, read from one shared synth (validator off; cdk-nag
on, as on every synth)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template

from tests.support.template import ROOT, definition, only, resources
from trialbox import __version__
from trialbox import constants as c

HOURS_A_MONTH = 730
# us-east-1 list prices (AWS pricing pages): PrivateLink interface endpoint per endpoint-AZ-hour;
# KMS customer managed key per month; CloudWatch standard-resolution alarm per metric per month;
# Route 53 Resolver DNS Firewall per domain name per month.
ENDPOINT_AZ_HOUR = 0.01
KMS_KEY_MONTH = 1.00
ALARM_METRIC_MONTH = 0.10
FIREWALL_DOMAIN_MONTH = 0.0005
# Lambda on ARM (us-east-1): per GB-second of billed duration, per request.
LAMBDA_ARM_GB_S = 0.0000133334
LAMBDA_REQUEST = 0.20 / 1_000_000


def alarms(template: Template) -> dict[str, dict[str, Any]]:
    return {k: a["Properties"] for k, a in resources(template, "AWS::CloudWatch::Alarm").items()}


# --- the ECS service -------------------------------------------------------------------------


def test_a_failing_deployment_rolls_back(template: Template) -> None:
    _, service = only(template, "AWS::ECS::Service")
    deployment = service["Properties"]["DeploymentConfiguration"]
    assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}


def test_the_service_waits_for_its_capacity_providers(template: Template) -> None:
    association, props = only(template, "AWS::ECS::ClusterCapacityProviderAssociations")
    assert set(props["Properties"]["CapacityProviders"]) == {"FARGATE", "FARGATE_SPOT"}
    _, service = only(template, "AWS::ECS::Service")
    assert association in service["DependsOn"]


def test_an_update_never_resets_the_pool_size(template: Template) -> None:
    """A DesiredCount would be applied again on every update: an image deploy would drop a busy
    pool to it. Without one, the scaler alone owns the count after creation: no Application
    Auto Scaling target either, whose policies would set it back."""
    _, service = only(template, "AWS::ECS::Service")
    assert "DesiredCount" not in service["Properties"]
    assert not resources(template, "AWS::ApplicationAutoScaling::ScalableTarget")


# --- the pool's scaler -----------------------------------------------------------------------


def scaler_function(template: Template) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (k, f["Properties"])
        for k, f in resources(template, "AWS::Lambda::Function").items()
        if f["Properties"]["Handler"] == "functions.scaler.handler.handler"
    ]
    return found


def test_the_scaler_runs_each_minute_in_place_of_step_policies(template: Template) -> None:
    from infra.config import StackConfig
    from trialbox import settings as s

    assert not resources(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
    function_id, props = scaler_function(template)
    (rule,) = [
        r["Properties"]
        for r in resources(template, "AWS::Events::Rule").values()
        if any(t["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]} for t in r["Properties"]["Targets"])
    ]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    assert rule.get("State", "ENABLED") == "ENABLED"
    (target,) = rule["Targets"]
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0  # the next minute's run decides
    env = props["Environment"]["Variables"]
    pool = StackConfig().pool
    assert (env[c.ENV_POOL_MIN_TASKS], env[c.ENV_POOL_MAX_TASKS]) == (
        str(pool.min_workers),
        str(pool.max_workers),
    )
    assert env[c.ENV_POOL_SLOTS_PER_TASK] == str(s.TASK_SLOTS)
    assert float(env[c.ENV_SCALE_IN_IDLE_S]) == s.SCALE_IN_IDLE_S == 300
    tick, run = float(env[c.ENV_SCALER_TICK_S]), float(env[c.ENV_SCALER_RUN_S])
    # Decisions every 10 s through the minute, the last one within the function's timeout.
    assert (tick, run) == (s.SCALER_TICK_S, s.SCALER_RUN_S) == (10, 50)
    assert run + 2 * tick <= props["Timeout"] < 60 + run
    service_id, _ = only(template, "AWS::ECS::Service")
    assert env[c.ENV_POOL_SERVICE] == {"Ref": service_id}


def test_the_scaler_is_granted_its_calls_on_its_resources_and_no_more(template: Template) -> None:
    _, props = scaler_function(template)
    role = props["Role"]["Fn::GetAtt"][0]
    statements = [
        statement
        for policy in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    granted = {}
    for statement in statements:
        actions = statement["Action"]
        for action in [actions] if isinstance(actions, str) else actions:
            granted[action] = statement
    assert set(granted) == {
        "ecs:DescribeServices",
        "ecs:UpdateService",
        "sqs:GetQueueAttributes",
        "dynamodb:BatchGetItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
        "cloudwatch:GetMetricData",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
    }
    service_id, _ = only(template, "AWS::ECS::Service")
    for action in ("ecs:DescribeServices", "ecs:UpdateService"):
        assert granted[action]["Resource"] == {"Ref": service_id}
    requests, _ = only(template, "AWS::SQS::Queue", "IntakeRequestsQueue")
    work, _ = only(template, "AWS::SQS::Queue", "PoolWorkQueue")
    opens, _ = only(template, "AWS::SQS::Queue", "PoolOpensQueue")
    queues = granted["sqs:GetQueueAttributes"]["Resource"]
    assert sorted(q["Fn::GetAtt"][0] for q in queues) == sorted([requests, work, opens])
    table, _ = only(template, "AWS::DynamoDB::Table", "StorageAdmission")
    items = granted["dynamodb:GetItem"]
    assert items["Resource"] == {"Fn::GetAtt": [table, "Arn"]}
    # Only the count's shards and the scaler's idle clock: never a lease or a marker.
    keys = items["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"]
    assert keys == ["pool", *(f"pool#{k}" for k in range(8)), "scaler"]
    assert granted["cloudwatch:GetMetricData"]["Resource"] == "*"  # it takes no resource


# --- alarms and their topic ------------------------------------------------------------------


def test_the_alarm_topic_is_encrypted_tls_only_and_open_to_cloudwatch(template: Template) -> None:
    topic_id, topic = only(template, "AWS::SNS::Topic")
    key_id, key = only(template, "AWS::KMS::Key")
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key["Properties"]["EnableKeyRotation"] is True
    key_statements = key["Properties"]["KeyPolicy"]["Statement"]
    assert any(
        s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
        and set(s["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
        for s in key_statements
    )
    _, policy = only(template, "AWS::SNS::TopicPolicy")
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert {
        "Action": "sns:Publish",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        "Effect": "Deny",
        "Principal": "*",
        "Resource": {"Ref": topic_id},
        "Sid": "AllowPublishThroughSSLOnly",
    } in statements
    (cloudwatch,) = [s for s in statements if s["Effect"] == "Allow"]
    assert cloudwatch["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert cloudwatch["Condition"]["StringEquals"] == {
        "aws:SourceAccount": {"Ref": "AWS::AccountId"}
    }
    assert resources(template, "AWS::SNS::Subscription") == {}  # no alarm_email by default


def test_every_alarm_pages_through_the_topic(template: Template) -> None:
    """The scaler is a function, not alarms: every alarm left pages."""
    topic_id, _ = only(template, "AWS::SNS::Topic")
    paging = []
    for logical_id, alarm in alarms(template).items():
        assert alarm.get("AlarmActions", []) == [{"Ref": topic_id}], logical_id
        paging.append(logical_id)
    expected = ("DlqNotEmpty", "OldestMessage", "ExecutionsFailed", "SandboxErrorRate", "Lost")
    for name in expected:  # 2 queues x (DLQ, age), executions failed, and the two below
        assert any(name in logical_id for logical_id in paging), name
    assert len(paging) >= 7


def test_the_sandbox_error_rate_alarm(template: Template) -> None:
    (alarm,) = [
        a for k, a in alarms(template).items() if k.startswith("MonitoringSandboxErrorRate")
    ]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (
        0.25,
        "GreaterThanOrEqualToThreshold",
    )
    metrics = {m["Id"]: m for m in alarm["Metrics"]}
    (expression,) = [m for m in alarm["Metrics"] if m.get("ReturnData", True)]
    assert expression["Expression"] == "IF(results >= 5, rate, 0)"
    (recorder,) = [
        f["Properties"]
        for k, f in resources(template, "AWS::Lambda::Function").items()
        if k.startswith("RecorderFunction")
    ]
    service = recorder["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
    assert recorder["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == "Trialbox"
    for metric_id, stat in (("rate", "Average"), ("results", "SampleCount")):
        stat_of = metrics[metric_id]["MetricStat"]
        assert stat_of["Stat"] == stat and stat_of["Period"] == 300
        assert stat_of["Metric"] == {
            "Namespace": c.METRICS_NAMESPACE,
            "MetricName": c.METRIC_SANDBOX_ERROR,
            "Dimensions": [{"Name": "service", "Value": service}],
        }


def test_the_lost_sandbox_alarm_watches_the_execute_integration(template: Template) -> None:
    (alarm,) = [a for k, a in alarms(template).items() if k.startswith("MonitoringLostSandboxes")]
    assert alarm["Threshold"] == 0.5 and alarm["EvaluationPeriods"] == 1
    stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert {s["Metric"]["MetricName"] for s in stats.values()} == {
        "ServiceIntegrationsTimedOut",
        "ServiceIntegrationsFailed",
        "ServiceIntegrationsStarted",
    }
    resource = definition(template)["States"]["Execute"]["Resource"]
    assert resource == "arn:aws:states:::sqs:sendMessage.waitForTaskToken"
    integration = resource.removeprefix("arn:aws:states:::")
    for stat in stats.values():
        assert (stat["Stat"], stat["Period"], stat["Metric"]["Namespace"]) == (
            "Sum",
            300,
            "AWS/States",
        )
        ((dimension),) = stat["Metric"]["Dimensions"]
        assert dimension["Name"] == "ServiceIntegrationResourceArn"
        # Account-qualified, as Step Functions publishes it (the bare arn:...:states::: form of
        # the definition has no data points).
        parts = dimension["Value"]["Fn::Join"][1]
        assert parts[2:] == [
            ":states:",
            {"Ref": "AWS::Region"},
            ":",
            {"Ref": "AWS::AccountId"},
            f":{integration}",
        ]


def test_alarm_email_subscribes_to_the_topic() -> None:
    from app import build_app

    app = build_app(
        context={"aws:cdk:bundling-stacks": [], "trialbox": {"alarm_email": "ops@example.com"}}
    )
    template = Template.from_stack(app.node.find_child("Trialbox"))  # type: ignore[arg-type]
    topic_id, _ = only(template, "AWS::SNS::Topic")
    _, subscription = only(template, "AWS::SNS::Subscription")
    assert subscription["Properties"] == {
        "Protocol": "email",
        "TopicArn": {"Ref": topic_id},
        "Endpoint": "ops@example.com",
    }


def test_a_bad_alarm_email_fails_synth_with_its_name() -> None:
    from infra.config import StackConfig

    with pytest.raises(SystemExit) as failed:
        StackConfig.from_context({"alarm_email": "ops at example"})
    assert str(failed.value) == (
        "invalid cdk.json context:\n"
        "  trialbox.alarm_email: String should match pattern '^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$'"
    )


def test_a_pool_of_a_thousand_fits_a_default_accounts_lambda_concurrency() -> None:
    """Was a break (the scale audit): RunCode reserved 4 x max_workers, so max_workers 1,000
    reserved 4,000 of a default account's 1,000 and the deploy failed. Its reservation is the
    stack's own setting now, within the account's quota less Lambda's unreserved 100."""
    from app import build_app
    from infra.config import LAMBDA_UNRESERVED, StackConfig

    context = {"pool": {"max_workers": 1000}}
    app = build_app(context={"aws:cdk:bundling-stacks": [], "trialbox": context})
    template = Template.from_stack(app.node.find_child("Trialbox"))  # type: ignore[arg-type]
    reserved = [
        props["Properties"]["ReservedConcurrentExecutions"]
        for props in template.find_resources("AWS::Lambda::Function").values()
        if "ReservedConcurrentExecutions" in props["Properties"]
    ]
    config = StackConfig.from_context(context)
    assert reserved == [config.run_code_concurrency]
    assert sum(reserved) <= config.lambda_concurrency_quota - LAMBDA_UNRESERVED


@pytest.mark.parametrize(
    ("context", "says"),
    [
        (
            {"pool": {"max_workers": 5001}},
            "  trialbox.pool: pool.max_workers 5001 is over 5,000, the most tasks "
            "one ECS service runs (Amazon ECS service quotas: tasks per service); deploy a "
            "second stack for more",
        ),
        (
            {"run_code_concurrency": 901},
            "  trialbox: run_code_concurrency 901 leaves Lambda less than the 100 "
            "unreserved it keeps of lambda_concurrency_quota 1000: at most 900, or raise the "
            "quota (Service Quotas) and lambda_concurrency_quota with it",
        ),
    ],
)
def test_what_an_account_cannot_run_fails_synth_and_says_why(
    context: dict[str, object], says: str
) -> None:
    from infra.config import StackConfig

    with pytest.raises(SystemExit) as failed:
        StackConfig.from_context(context)
    assert str(failed.value) == "invalid cdk.json context:\n" + says


def test_a_raised_quota_takes_a_larger_run_code_reservation() -> None:
    from infra.config import StackConfig

    raised = {"run_code_concurrency": 2000, "lambda_concurrency_quota": 5000}
    config = StackConfig.from_context(raised)
    assert config.run_code_concurrency == 2000


# --- the version output ----------------------------------------------------------------------


def test_the_stack_says_its_version(template: Template) -> None:
    output = template.find_outputs(c.OUTPUT_STACK_VERSION)[c.OUTPUT_STACK_VERSION]
    assert output["Value"] == __version__
    assert output["Export"]["Name"] == f"Trialbox-{c.OUTPUT_STACK_VERSION}"


# --- the README's idle cost ------------------------------------------------------------------


def idle_cost_rows(template: Template) -> list[str]:
    """The README's idle-cost table, computed from the template: what is billed by the hour or
    month with no job running (the pool is at min_workers = 0)."""
    endpoints = [
        e["Properties"]
        for e in resources(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"].get("VpcEndpointType") == "Interface"
    ]
    (azs,) = {len(e["SubnetIds"]) for e in endpoints}
    keys = len(resources(template, "AWS::KMS::Key"))
    alarm_metrics = sum(
        1 if "MetricName" in a else sum("MetricStat" in m for m in a["Metrics"])
        for a in alarms(template).values()
    )
    domains = sum(
        len(d["Properties"]["Domains"])
        for d in resources(template, "AWS::Route53Resolver::FirewallDomainList").values()
    )
    # The scaler runs every minute, idle or not, for its run (plus about a second: its last
    # tick's calls), at its memory.
    _, scaler = scaler_function(template)
    memory_gb = scaler["MemorySize"] / 1024
    billed_s = float(scaler["Environment"]["Variables"][c.ENV_SCALER_RUN_S]) + 1
    runs = HOURS_A_MONTH * 60
    costs = [
        len(endpoints) * azs * ENDPOINT_AZ_HOUR * HOURS_A_MONTH,
        keys * KMS_KEY_MONTH,
        alarm_metrics * ALARM_METRIC_MONTH,
        domains * FIREWALL_DOMAIN_MONTH,
        runs * (billed_s * memory_gb * LAMBDA_ARM_GB_S + LAMBDA_REQUEST),
    ]
    return [
        f"| interface VPC endpoints x AZs | {len(endpoints)} x {azs} "
        f"| ${ENDPOINT_AZ_HOUR:.2f} per endpoint per AZ per hour x {HOURS_A_MONTH} h "
        f"| ${costs[0]:.2f} |",
        f"| KMS key (the alarm topic's) | {keys} | ${KMS_KEY_MONTH:.2f} per key per month "
        f"| ${costs[1]:.2f} |",
        f"| CloudWatch alarm metrics | {alarm_metrics} | ${ALARM_METRIC_MONTH:.2f} per metric "
        f"per month | ${costs[2]:.2f} |",
        f"| DNS Firewall domain names | {domains} | ${FIREWALL_DOMAIN_MONTH:.4f} per name per "
        f"month | ${costs[3]:.2f} |",
        f"| the pool's scaler (Lambda, {scaler['MemorySize']} MB ARM, {billed_s:.0f} s a minute) "
        f"| {runs:,} runs | ${LAMBDA_ARM_GB_S:.10f} per GB-s + $0.20 per million runs "
        f"| ${costs[4]:.2f} |",
        f"| **idle total** | | | **${sum(costs):.2f}** |",
    ]


def test_the_readme_idle_cost_is_the_templates(template: Template) -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [row for row in idle_cost_rows(template) if row not in readme]
    assert not missing, "README.md's idle-cost table is stale; its rows should be:\n" + "\n".join(
        idle_cost_rows(template)
    )


def test_the_pool_s_subnets_hold_a_full_service_in_three_zones(template: Template) -> None:
    """A task takes an address (its ENI) and each interface endpoint one a subnet; AWS keeps 5
    a subnet. The subnets must hold the most tasks one service runs, spread over 3 zones."""
    from infra.config import MAX_TASKS_PER_SERVICE

    subnets = [s["Properties"] for s in resources(template, "AWS::EC2::Subnet").values()]
    zones = {json.dumps(s["AvailabilityZone"], sort_keys=True) for s in subnets}
    endpoints = [
        e for e in resources(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"].get("VpcEndpointType") == "Interface"
    ]  # fmt: skip
    usable = sum(2 ** (32 - int(s["CidrBlock"].split("/")[1])) - 5 for s in subnets)
    assert len(zones) == 3
    assert usable - len(endpoints) * len(subnets) >= MAX_TASKS_PER_SERVICE


@pytest.mark.parametrize(
    ("pool", "strategy"),
    [
        ({}, [{"CapacityProvider": "FARGATE_SPOT", "Weight": 1}]),
        ({"spot": False}, [{"CapacityProvider": "FARGATE", "Weight": 1}]),
        (
            {"on_demand_base": 2, "on_demand_weight": 1},
            [
                {"CapacityProvider": "FARGATE", "Base": 2, "Weight": 1},
                {"CapacityProvider": "FARGATE_SPOT", "Weight": 1},
            ],
        ),
    ],
)
def test_an_on_demand_base_goes_first_and_spot_is_weighted_beside_it(
    pool: dict[str, object], strategy: list[dict[str, object]]
) -> None:
    from infra.config import PoolConfig
    from infra.pool import capacity_strategy

    config = PoolConfig.model_validate(pool)
    found = [
        {"CapacityProvider": s.capacity_provider, "Base": s.base, "Weight": s.weight}
        for s in capacity_strategy(config)
    ]
    assert [{k: v for k, v in s.items() if v is not None} for s in found] == strategy
