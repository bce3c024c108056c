"""Alarms as the stack raises them: a metric at or above a threshold, missing data is fine.

Each is a `PagingAlarm`: the stack sends every one to its alarm topic (`Monitoring.route`).
"""

from __future__ import annotations

from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct


class PagingAlarm(cloudwatch.Alarm):
    """An alarm someone is told about (a scaling alarm is not one)."""


def at_least(
    scope: Construct,
    construct_id: str,
    metric: cloudwatch.IMetric,
    threshold: float,
    description: str,
    periods: int = 1,
) -> cloudwatch.Alarm:
    return PagingAlarm(
        scope,
        construct_id,
        metric=metric,
        threshold=threshold,
        evaluation_periods=periods,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        alarm_description=description,
    )
