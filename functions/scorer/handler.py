"""Scorer: the raw run report -> reward, breakdown and feedback (trialbox.scoring)."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.models.jobs import ExecutionDone, JobRef
from trialbox.pipeline.score import Scorer
from trialbox.pipeline.stores import ObjectStore
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
settings = FunctionSettings.from_env()
scorer = Scorer(jobs=ObjectStore(boto3.client("s3"), settings.traces_bucket))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    job = JobRef.model_validate(event["job"])
    done = ExecutionDone.model_validate(event["execution"])
    return scorer(job, done).model_dump()
