"""Prepare: resolve the task, merge limits, write the job spec; return a small reference."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.models.jobs import RolloutInput
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.stores import ObjectStore
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
settings = FunctionSettings.from_env()
s3 = boto3.client("s3")
prepare = Preparer(
    tasksets=ObjectStore(s3, settings.tasksets_bucket),
    jobs=ObjectStore(s3, settings.traces_bucket),
    heartbeat_s=settings.heartbeat_s,
    margin_s=settings.execute_margin_s,
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    rollout = RolloutInput.model_validate(
        {k: v for k, v in event.items() if k in RolloutInput.model_fields}
    )
    return prepare(rollout).model_dump()
