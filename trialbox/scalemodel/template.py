"""What the scale model reads from a synthesized template: the pool's scalable target and
its step-scaling policies (each with its alarm's threshold, comparison and period)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).parent.parent / "local" / "data" / "template.json"


@dataclass(frozen=True)
class Step:
    lower: float | None  # metric - threshold, inclusive
    upper: float | None  # exclusive
    change: int


@dataclass(frozen=True)
class StepPolicy:
    name: str
    threshold: float
    above: bool  # the alarm fires at metric >= threshold (else at <=)
    period_s: int
    evaluations: int
    cooldown_s: int
    steps: tuple[Step, ...]
    metrics: frozenset[str]  # the metric ids its expression sums (waiting, running, ...)

    def change(self, metric: float) -> int:
        """The policy's adjustment for this metric value; 0 when its alarm is not firing."""
        if (metric < self.threshold) if self.above else (metric > self.threshold):
            return 0
        over = metric - self.threshold
        for step in self.steps:  # above: [lower, upper); below: (lower, upper] (AWS's bounds)
            low = step.lower is None or (over >= step.lower if self.above else over > step.lower)
            high = step.upper is None or (over < step.upper if self.above else over <= step.upper)
            if low and high:
                return step.change
        return 0


@dataclass(frozen=True)
class PoolScaling:
    min_tasks: int
    max_tasks: int
    policies: tuple[StepPolicy, ...]


def pool_scaling(template: dict[str, Any] | None = None) -> PoolScaling:
    template = template or json.loads(TEMPLATE.read_text())
    resources = template["Resources"]
    target = next(
        r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
    )
    alarms = {
        name: r["Properties"]
        for name, r in resources.items()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    }
    policies = []
    for name, resource in resources.items():
        if resource["Type"] != "AWS::ApplicationAutoScaling::ScalingPolicy":
            continue
        config = resource["Properties"]["StepScalingPolicyConfiguration"]
        alarm = next(
            a
            for a in alarms.values()
            if any(action.get("Ref") == name for action in a.get("AlarmActions", []))
        )
        stats = [m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m]
        policies.append(
            StepPolicy(
                name=name,
                threshold=float(alarm["Threshold"]),
                above=alarm["ComparisonOperator"].startswith("Greater"),
                period_s=int(stats[0]["Period"]),
                evaluations=int(alarm["EvaluationPeriods"]),
                cooldown_s=int(config["Cooldown"]),
                steps=tuple(
                    Step(
                        s.get("MetricIntervalLowerBound"),
                        s.get("MetricIntervalUpperBound"),
                        int(s["ScalingAdjustment"]),
                    )
                    for s in config["StepAdjustments"]
                ),
                metrics=frozenset(m["Id"] for m in alarm["Metrics"] if "MetricStat" in m),
            )
        )
    return PoolScaling(int(target["MinCapacity"]), int(target["MaxCapacity"]), tuple(policies))
