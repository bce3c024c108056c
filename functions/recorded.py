"""The metrics of a result written, shared by the functions that record one (Record, the
finisher): written or already there, and the `sandbox_error` rate."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from trialbox.constants import METRIC_SANDBOX_ERROR
from trialbox.models import Status
from trialbox.pipeline.recorder import Recorded


def count_recorded(metrics: Metrics, recorded: Recorded) -> None:
    metrics.add_metric(
        name="ResultsWritten" if recorded.written else "ResultsAlreadyRecorded",
        unit=MetricUnit.Count,
        value=1,
    )
    if recorded.written:  # 0 or 1 per result: its Average is the sandbox_error rate
        is_error = recorded.status == Status.SANDBOX_ERROR
        metrics.add_metric(name=METRIC_SANDBOX_ERROR, unit=MetricUnit.Count, value=int(is_error))
