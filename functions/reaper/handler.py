"""Reaper: each minute, deletes the queues of sessions past their TTL that nobody ended (the
trainer and the hosting worker both died), and gives back the admission slots of requests whose
executions ended without Record releasing them (a cancel, Record's own fallback)."""

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.pipeline.admission import Admission
from trialbox.pipeline.dead_letters import EndedWithoutResult
from trialbox.pipeline.reaper import reap
from trialbox.pipeline.stores import ResultTable
from trialbox.settings import FunctionSettings

logger = Logger()
tracer = Tracer()
metrics = Metrics()
settings = FunctionSettings.from_env()
sqs = boto3.client("sqs")
dynamodb = boto3.client("dynamodb")
admission = Admission(dynamodb, settings.required("admission_table"))
ended = EndedWithoutResult(
    boto3.client("stepfunctions"),
    settings.required("rollout_arn"),
    ResultTable(dynamodb, settings.required("executions_table"), settings.result_ttl_days),
    batch_arn=settings.required("batch_arn"),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    reaped = reap(sqs, settings.required("session_queue_prefix"))
    metrics.add_metric(name="SessionQueuesReaped", unit=MetricUnit.Count, value=len(reaped.deleted))
    released = admission.reconcile(settings.required("executions_table"), ended)
    metrics.add_metric(name="AdmissionsReleased", unit=MetricUnit.Count, value=len(released))
    return {"deleted": reaped.deleted, "kept": reaped.kept, "released": released}
