"""Batch Settle: the batch's Run failed or timed out, so every sample of it still without a
result gets its `sandbox_error`, naming the error that ended Run."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.models.batches import BatchSettle
from trialbox.pipeline.recorder import recorder_for
from trialbox.pipeline.settle import Settler
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
s3 = boto3.client("s3")
settle = Settler(recorder_for(settings, dynamodb, s3))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    step = BatchSettle.model_validate(event)
    written = settle(step.batch, step.error)
    metrics.add_metric(name="BatchSamplesSettled", unit=MetricUnit.Count, value=len(written))
    return {"settled": written}
