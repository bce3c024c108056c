"""Recorder: the one terminal result per request id (conditional put), plus the trace."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.pipeline.recorder import Recorder, RecordInput
from trialbox.pipeline.settings import FunctionSettings, client
from trialbox.pipeline.stores import ObjectStore, ResultTable

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
recorder = Recorder(
    table=ResultTable(
        client("dynamodb"), settings.required("executions_table"), settings.result_ttl_days
    ),
    traces=ObjectStore(client("s3"), settings.traces_bucket),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    written = recorder(RecordInput.model_validate(event))
    metrics.add_metric(
        name="ResultsWritten" if written else "ResultsAlreadyRecorded",
        unit=MetricUnit.Count,
        value=1,
    )
    return {"written": written}
