"""Dead letters: each request whose execution never started gets its `sandbox_error` result."""

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

from trialbox.pipeline.admission import Admission
from trialbox.pipeline.batching import BatchStarter
from trialbox.pipeline.dead_letters import DeadLetters
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
settings = FunctionSettings.from_env()
dynamodb = boto3.client("dynamodb")
sfn = boto3.client("stepfunctions")
answer = DeadLetters(
    sfn=sfn,
    rollout_arn=settings.required("rollout_arn"),
    table=ResultTable(dynamodb, settings.required("executions_table"), settings.result_ttl_days),
    admission=Admission(dynamodb, settings.required("admission_table")),
    batches=BatchStarter(
        sfn,
        dynamodb,
        settings.required("admission_table"),
        settings.required("batch_arn"),
        ObjectStore(boto3.client("s3"), settings.traces_bucket),
    ),
)


def record_handler(record: SQSRecord) -> None:
    outcome = answer(record.body, dict(record.message_attributes))
    logger.info("a dead-lettered request", extra={"outcome": outcome.value})
    metrics.add_metric(name=f"DeadLetters_{outcome.value}", unit=MetricUnit.Count, value=1)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
