"""Reaper: each minute, deletes the queues of sessions past their TTL that nobody ended (the
trainer and the hosting worker both died)."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.pipeline.reaper import reap
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
sqs = boto3.client("sqs")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    reaped = reap(sqs, settings.required("session_queue_prefix"))
    metrics.add_metric(name="SessionQueuesReaped", unit=MetricUnit.Count, value=len(reaped.deleted))
    return {"deleted": reaped.deleted, "kept": reaped.kept}
