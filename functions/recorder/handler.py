"""Recorder: the one terminal result per request id (conditional put), plus the trace."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.constants import METRIC_SANDBOX_ERROR
from trialbox.models import Status
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.recorder import Recorder, RecordInput
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
recorder = Recorder(
    table=ResultTable(dynamodb, settings.required("executions_table"), settings.result_ttl_days),
    traces=ObjectStore(boto3.client("s3"), settings.traces_bucket),
    admission=Admission(dynamodb, settings.required("admission_table")),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    recorded = recorder(RecordInput.model_validate(event))
    metrics.add_metric(
        name="ResultsWritten" if recorded.written else "ResultsAlreadyRecorded",
        unit=MetricUnit.Count,
        value=1,
    )
    if recorded.written:  # 0 or 1 per result: its Average is the sandbox_error rate
        is_error = recorded.status == Status.SANDBOX_ERROR
        metrics.add_metric(name=METRIC_SANDBOX_ERROR, unit=MetricUnit.Count, value=int(is_error))
    return {"written": recorded.written}
