"""Scaler: each minute (EventBridge), sets the pool's ECS desired count from the demand (the
requests not yet admitted, the work waiting, the admission count, the sessions held), deciding
every TRIALBOX_SCALER_TICK_S for TRIALBOX_SCALER_RUN_S (trialbox.pipeline.scaler)."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.pipeline.admission import Admission
from trialbox.pipeline.scaler import DemandReader, IdleClock, PoolService, Scaler
from trialbox.pipeline.scaling import PoolBounds
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
table = settings.required("admission_table")
scaler = Scaler(
    demand=DemandReader(
        sqs=boto3.client("sqs"),
        cloudwatch=boto3.client("cloudwatch"),
        admission=Admission(dynamodb, table),
        requests_queue_url=settings.required("requests_queue_url"),
        work_queue_url=settings.required("work_queue_url"),
        open_queue_url=settings.required("open_queue_url"),
        pool_name=settings.pool_name,
    ),
    service=PoolService(
        boto3.client("ecs"), settings.required("cluster"), settings.required("pool_service")
    ),
    idle=IdleClock(dynamodb, table),
    bounds=PoolBounds(
        min_tasks=settings.pool_min_tasks,
        max_tasks=settings.pool_max_tasks,
        slots_per_task=settings.pool_slots_per_task,
        idle_s=settings.scale_in_idle_s,
    ),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The last tick starts a tick's length before the function's timeout at the latest.
    left_s = context.get_remaining_time_in_millis() / 1000 - settings.scaler_tick_s
    decisions = scaler.run(max(0.0, min(settings.scaler_run_s, left_s)), settings.scaler_tick_s)
    changes = [d for d in decisions if d.desired != d.current]
    metrics.add_metric(name="PoolScaled", unit=MetricUnit.Count, value=len(changes))
    if decisions:
        last = decisions[-1]
        metrics.add_metric(name="PoolDesiredTasks", unit=MetricUnit.Count, value=last.desired)
        metrics.add_metric(name="PoolDemand", unit=MetricUnit.Count, value=last.demand.total)
    return {"ticks": len(decisions), "desired": [d.desired for d in decisions]}
