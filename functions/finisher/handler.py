"""Finisher: a batched sample's end (finish queue) -> its Score and Record, then its place in
its batch's ledger; the last sample of a batch answers the batch's token."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.constants import METRIC_SANDBOX_ERROR
from trialbox.models import Status
from trialbox.models.batches import Finished
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.finish import Finisher
from trialbox.pipeline.recorder import Recorder
from trialbox.pipeline.score import Scorer
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
traces = ObjectStore(boto3.client("s3"), settings.traces_bucket)
admission_table = settings.required("admission_table")
finish = Finisher(
    scorer=Scorer(traces),
    recorder=Recorder(
        table=ResultTable(
            dynamodb, settings.required("executions_table"), settings.result_ttl_days
        ),
        traces=traces,
        admission=Admission(dynamodb, admission_table),
    ),
    ledger=Ledger(dynamodb, boto3.client("stepfunctions"), admission_table),
)


def record_handler(record: SQSRecord) -> None:
    recorded = finish(Finished.model_validate_json(record.body))
    if recorded is None:
        return
    metrics.add_metric(
        name="ResultsWritten" if recorded.written else "ResultsAlreadyRecorded",
        unit=MetricUnit.Count,
        value=1,
    )
    if recorded.written:  # 0 or 1 per result: its Average is the sandbox_error rate
        is_error = recorded.status == Status.SANDBOX_ERROR
        metrics.add_metric(name=METRIC_SANDBOX_ERROR, unit=MetricUnit.Count, value=int(is_error))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
