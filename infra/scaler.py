"""The pool's scaler (trialbox.pipeline.scaler): a function EventBridge runs each minute, which
sets the ECS service's desired count from the demand every SCALER_TICK_S within the minute.

It replaces step scaling, whose policies grew the pool by at most 20 tasks a minute and shrank
it by one task per 2 minutes (docs/scaling.md: 205 min from idle to 4,096 tasks, 280,000 idle
task-hours after). The service has no Application Auto Scaling target: the scaler alone owns
the desired count, and nothing else sets it back."""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import PoolConfig
from infra.lambdas import TrialboxFunction
from infra.nag import acknowledge
from infra.pool import Pool
from trialbox import constants as c
from trialbox.pipeline.admission import COUNT_SHARDS, POOL
from trialbox.pipeline.scaler import IDLE_PART
from trialbox.settings import SCALE_IN_IDLE_S, SCALER_RUN_S, SCALER_TICK_S, TASK_SLOTS

SCALE_EVERY = Duration.minutes(1)  # EventBridge's shortest rate
# One invocation decides every SCALER_TICK_S for SCALER_RUN_S; its last tick ends well within.
SCALER_TIMEOUT = Duration.seconds(int(SCALER_RUN_S + 2 * SCALER_TICK_S + 5))
# It runs (mostly waiting) through 50 s of every minute, so its memory is its idle cost: 128 MB
# bills 6.4 GB-s a minute, about $3.70 a month on ARM (README, "Idle cost"); a tick is six calls.
SCALER_MEMORY_MB = 128
# The admission table's partitions the scaler reads or writes: the count's shards (and the
# count from before the shards), and its own idle clock.
SCALER_ITEMS = [POOL, *(f"{POOL}#{k}" for k in range(COUNT_SHARDS)), IDLE_PART]


def scaler_environment(
    pool: Pool, config: PoolConfig, requests: sqs.IQueue, admission: dynamodb.ITable
) -> dict[str, str]:
    return {
        c.ENV_REQUESTS_QUEUE_URL: requests.queue_url,
        c.ENV_WORK_QUEUE_URL: pool.work.queue.queue_url,
        c.ENV_OPEN_QUEUE_URL: pool.opens.queue.queue_url,
        c.ENV_ADMISSION_TABLE: admission.table_name,
        c.ENV_CLUSTER: pool.cluster.cluster_name,
        c.ENV_POOL_SERVICE: pool.service.service_arn,
        c.ENV_POOL_NAME: Stack.of(pool).stack_name,  # HeldSessions' Pool dimension
        c.ENV_POOL_MIN_TASKS: str(config.min_workers),
        c.ENV_POOL_MAX_TASKS: str(config.max_workers),
        c.ENV_POOL_SLOTS_PER_TASK: str(TASK_SLOTS),
        c.ENV_SCALE_IN_IDLE_S: f"{SCALE_IN_IDLE_S:g}",
        c.ENV_SCALER_TICK_S: f"{SCALER_TICK_S:g}",
        c.ENV_SCALER_RUN_S: f"{SCALER_RUN_S:g}",
    }


def schedule_scaler(
    scope: Construct,
    scaler: TrialboxFunction,
    pool: Pool,
    requests: sqs.IQueue,
    admission: dynamodb.ITable,
) -> events.Rule:
    """Grant the scaler what it calls, and no more (tests/iam proves it call by call), and
    run it each minute."""
    role = scaler.role
    # Its desired count, read and set: this one service.
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["ecs:DescribeServices", "ecs:UpdateService"],
            resources=[pool.service.service_arn],
        )
    )
    # The three queues' depths.
    for queue in (requests, pool.work.queue, pool.opens.queue):
        queue.grant(role, "sqs:GetQueueAttributes")
    # The count's shards (one BatchGetItem) and its idle clock, and no other item of the table.
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=[
                "dynamodb:BatchGetItem",
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:DeleteItem",
            ],
            resources=[admission.table_arn],
            conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": SCALER_ITEMS}},
        )
    )
    # The pool's HeldSessions: GetMetricData takes no resource (IAM: "*").
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["cloudwatch:GetMetricData"], resources=["*"])
    )
    acknowledge(
        role,
        {
            "AwsSolutions-IAM5[Resource::*]": (
                "cloudwatch:GetMetricData takes no resource (the pool's HeldSessions); "
                "X-Ray's neither"
            )
        },
    )
    return events.Rule(
        scope,
        "ScalerSchedule",
        schedule=events.Schedule.rate(SCALE_EVERY),
        targets=[targets.LambdaFunction(scaler.function, retry_attempts=0)],
    )
