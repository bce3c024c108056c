"""Recorder: the one terminal result per request id (conditional put), plus the trace."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.recorded import count_recorded
from trialbox.pipeline.recorder import RecordInput, recorder_for
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
s3 = boto3.client("s3")
recorder = recorder_for(settings, dynamodb, s3)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    recorded = recorder(RecordInput.model_validate(event))
    count_recorded(metrics, recorded)
    return {"written": recorded.written}
