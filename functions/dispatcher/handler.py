"""Dispatcher: requests queue -> executions, each request once a pool slot is free for it
(admission): the requests of one SQS batch start as one Batch execution, a request alone as
its own Rollout execution; with a partial batch response."""

import time
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
from trialbox.pipeline.dispatch import Dispatched, Dispatcher, Starts
from trialbox.pipeline.stores import ObjectStore, ResultTable
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
settings = FunctionSettings.from_env()
sqs = boto3.client("sqs")
dynamodb = boto3.client("dynamodb")


def dead_letter(body: str, reason: str) -> None:
    logger.warning("dead-lettering a request", extra={"reason": reason})
    metrics.add_metric(name="RequestsDeadLettered", unit=MetricUnit.Count, value=1)
    sqs.send_message(
        QueueUrl=settings.required("requests_dlq_url"),
        MessageBody=body,
        MessageAttributes={"reason": {"DataType": "String", "StringValue": reason}},
    )


def requeue(body: str) -> None:
    """Back to the requests queue as a new message (not a failed receive: a request may wait
    there for a slot as long as it must, and never dead-letters for it)."""
    sqs.send_message(QueueUrl=settings.required("requests_queue_url"), MessageBody=body)


sfn = boto3.client("stepfunctions")
traces = ObjectStore(boto3.client("s3"), settings.traces_bucket)
dispatch = Dispatcher(
    sfn=sfn,
    rollout_arn=settings.required("rollout_arn"),
    table=ResultTable(dynamodb, settings.required("executions_table"), settings.result_ttl_days),
    payloads=traces,
    dead_letter=dead_letter,
    admission=Admission(dynamodb, settings.required("admission_table")),
    requeue=requeue,
    batches=BatchStarter(
        sfn, dynamodb, settings.required("admission_table"), settings.required("batch_arn"), traces
    ),
)
starts = Starts(dispatch)  # this invocation's: reset by each
# A request waits here for a slot until this long before the invocation's end, then goes back.
REQUEUE_MARGIN_S = 8.0


def record_handler(record: SQSRecord, lambda_context: LambdaContext) -> None:
    """One message (Powertools passes the invocation's context to a handler that names it)."""
    left_s = lambda_context.get_remaining_time_in_millis() / 1000 - REQUEUE_MARGIN_S
    outcome = starts.add(record.message_id, record.body, time.monotonic() + max(left_s, 0.0))
    if outcome is not None:
        count(outcome)


def count(outcome: Dispatched) -> None:
    metrics.add_metric(name=f"Requests_{outcome.value}", unit=MetricUnit.Count, value=1)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    starts.held.clear()
    starts.failed.clear()
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    for outcome in starts.flush():
        count(outcome)
    # A start that failed: its messages come back too.
    failures = response["batchItemFailures"]
    failures += [{"itemIdentifier": message_id} for message_id in starts.failed]
    return response
