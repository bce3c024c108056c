"""Finisher: a batched sample's end (finish queue) -> its Score and Record, then its place in
its batch's ledger; the last sample of a batch answers the batch's token."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.recorded import count_recorded
from trialbox.models.batches import Finished
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.finish import Finisher
from trialbox.pipeline.recorder import recorder_for
from trialbox.pipeline.stores import ObjectStore
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
s3 = boto3.client("s3")
traces = ObjectStore(s3, settings.traces_bucket)
admission_table = settings.required("admission_table")
finish = Finisher(
    recorder=recorder_for(settings, dynamodb, s3),
    ledger=Ledger(dynamodb, boto3.client("stepfunctions"), admission_table),
)


def record_handler(record: SQSRecord) -> None:
    recorded = finish(Finished.model_validate_json(record.body))
    if recorded is not None:
        count_recorded(metrics, recorded)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
