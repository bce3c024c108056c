"""Batch Run: prepare every sample of a batch (each task set read once), send their work
messages, and hand the batch's ledger the token its execution waits on (docs/batches.md)."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.models.batches import BatchRun
from trialbox.pipeline.batch_prepare import BatchPreparer
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import recorder_for
from trialbox.pipeline.stores import ObjectStore
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
settings = FunctionSettings.from_env()
s3 = boto3.client("s3")
dynamodb = boto3.client("dynamodb")
traces = ObjectStore(s3, settings.traces_bucket)
admission_table = settings.required("admission_table")
run = BatchPreparer(
    prepare=Preparer(
        tasksets=ObjectStore(s3, settings.tasksets_bucket),
        jobs=traces,
        heartbeat_s=settings.heartbeat_s,
        margin_s=settings.execute_margin_s,
    ),
    recorder=recorder_for(settings, dynamodb, s3),
    ledger=Ledger(dynamodb, boto3.client("stepfunctions"), admission_table),
    requests=traces,
    sqs=boto3.client("sqs"),
    work_queue=settings.required("work_queue_url"),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    step = BatchRun.model_validate(event)
    run(step.batch, step.token)
    return {}
