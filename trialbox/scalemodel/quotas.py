"""The AWS quotas and prices the scale model uses, each with its source (the page's title, as
in ../shared/research/scale-audit.md). us-east-1, December 2026 list prices."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quota:
    value: float
    unit: str
    source: str


SFN_QUOTAS = "Step Functions service quotas"
FARGATE_THROTTLING = "AWS Fargate throttling quotas"
ECS_QUOTAS = "Amazon ECS endpoints and quotas"
DDB_PARTITIONS = "DynamoDB: throughput quotas per partition; transactional writes cost 2 WCU"
STEP_SCALING = "How step scaling for Application Auto Scaling works"
SQS_METRICS = "Available CloudWatch metrics for Amazon SQS (1-minute period)"
AUDIT = "../shared/research/scale-audit.md (30-60 s task start)"

QUOTAS: dict[str, Quota] = {
    "sfn_transitions_per_s": Quota(1500, "transitions/s (refill; bucket 5,000)", SFN_QUOTAS),
    "sfn_start_execution_per_s": Quota(300, "calls/s (refill; bucket 1,300)", SFN_QUOTAS),
    "sfn_start_execution_bucket": Quota(1300, "calls (the refill's bucket)", SFN_QUOTAS),
    "sfn_send_task_per_s": Quota(500, "calls/s, each of SendTaskSuccess/Heartbeat", SFN_QUOTAS),
    "fargate_launch_burst": Quota(100, "tasks", FARGATE_THROTTLING),
    "fargate_launch_per_s": Quota(20, "tasks/s (sustained)", FARGATE_THROTTLING),
    "fargate_task_start_s": Quota(45, "s from launch to a polling worker", AUDIT),
    "ecs_tasks_per_service": Quota(5000, "tasks", ECS_QUOTAS),
    "ddb_item_wcu_per_s": Quota(1000, "write units/s on one item's partition", DDB_PARTITIONS),
    "ddb_transact_wcu": Quota(2, "write units per item in a transaction", DDB_PARTITIONS),
    "metric_period_s": Quota(
        60, "s: SQS's metrics, and so a scaling alarm's evaluation", SQS_METRICS
    ),
}

PRICES: dict[str, Quota] = {
    "fargate_arm_vcpu_hour": Quota(0.03238, "$ per vCPU-hour", "AWS Fargate pricing"),
    "fargate_arm_gb_hour": Quota(0.00356, "$ per GB-hour", "AWS Fargate pricing"),
    "fargate_spot_discount": Quota(0.70, "share off on Fargate Spot", "AWS Fargate pricing"),
    "sfn_transition": Quota(0.025 / 1000, "$ per state transition", "AWS Step Functions Pricing"),
    "sqs_request": Quota(0.40 / 1e6, "$ per request (64 KB each)", "Amazon SQS pricing"),
    "s3_put": Quota(0.005 / 1000, "$ per PUT, COPY, POST or LIST", "Amazon S3 pricing"),
    "s3_get": Quota(0.0004 / 1000, "$ per GET and other requests", "Amazon S3 pricing"),
    "ddb_write_unit": Quota(0.625 / 1e6, "$ per write request unit (1 KB)",
                            "Amazon DynamoDB pricing for on-demand capacity"),
    "ddb_read_unit": Quota(0.125 / 1e6, "$ per read request unit (4 KB consistent)",
                           "Amazon DynamoDB pricing for on-demand capacity"),
    "lambda_request": Quota(0.20 / 1e6, "$ per invocation", "AWS Lambda pricing"),
    # The same sandbox-seconds elsewhere, list prices (scale-audit.md: $230 and $332 per
    # million 10 s sandboxes).
    "e2b_second": Quota(0.000014 + 2 * 0.0000045, "$ per s, 1 vCPU + 2 GiB",
                        "E2B Billing & pricing"),
    "modal_second": Quota(0.5 * 0.00003942 + 2 * 0.00000672, "$ per s, 0.5 core + 2 GiB",
                          "Modal Sandbox pricing"),
}  # fmt: skip


def value(name: str) -> float:
    return QUOTAS[name].value
