"""What the scale model reads from a synthesized template: the pool's scaler (its function's
bounds, idle time and tick: trialbox.pipeline.scaler), or, in a template from before it, the
pool's scalable target and step-scaling policies (each with its alarm's threshold, comparison
and period). STEP_POLICIES keeps those of the last template that had them, the audit's "today"
(tests/unit/test_scale_model.py reproduces the audit's figures on it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialbox import constants as c
from trialbox.pipeline.scaling import PoolBounds

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
    policies: tuple[StepPolicy, ...] = ()  # step scaling (before the scaler)
    scaler: PoolBounds | None = None  # the deployed scaler's rule and bounds
    tick_s: float = 60.0  # how often the scaler decides


SCALER_HANDLER = "functions.scaler.handler.handler"


def pool_scaling(template: dict[str, Any] | None = None) -> PoolScaling:
    template = template or json.loads(TEMPLATE.read_text())
    resources = template["Resources"]
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Function" and props["Handler"] == SCALER_HANDLER:
            env = props["Environment"]["Variables"]
            bounds = PoolBounds(
                min_tasks=int(env[c.ENV_POOL_MIN_TASKS]),
                max_tasks=int(env[c.ENV_POOL_MAX_TASKS]),
                slots_per_task=int(env[c.ENV_POOL_SLOTS_PER_TASK]),
                idle_s=float(env[c.ENV_SCALE_IN_IDLE_S]),
            )
            tick_s = float(env[c.ENV_SCALER_TICK_S])
            return PoolScaling(bounds.min_tasks, bounds.max_tasks, scaler=bounds, tick_s=tick_s)
    return _step_scaling(resources)


def _step_scaling(resources: dict[str, Any]) -> PoolScaling:
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


# The step scaling the stack deployed before its scaler (the template of commit cc0922e, read
# by _step_scaling): out on the backlog (+1 at >= 1, +5 at >= 20, +20 at >= 100, 60 s
# cooldown), in by 1 when nothing waits, runs or is held (120 s cooldown), each alarm on one
# 1-minute period. The audit's figures are for this.
STEP_POLICIES = PoolScaling(
    min_tasks=0,
    max_tasks=10,
    policies=(
        StepPolicy(
            name="Backlog",
            threshold=1.0,
            above=True,
            period_s=60,
            evaluations=1,
            cooldown_s=60,
            steps=(Step(0, 19, 1), Step(19, 99, 5), Step(99, None, 20)),
            metrics=frozenset({"waiting", "queued", "admitting"}),
        ),
        StepPolicy(
            name="Idle",
            threshold=0.0,
            above=False,
            period_s=60,
            evaluations=1,
            cooldown_s=120,
            steps=(Step(None, 0, -1),),
            metrics=frozenset({"waiting", "running", "queued", "admitting", "held"}),
        ),
    ),
)
