"""The pool's elastic scaler (issue 24; docs/scaling.md): the desired task count from the
backlog, once a minute. Out: in proportion to the work, at once (Fargate's launch rate, not a
step policy, limits how fast tasks come). In: to the warm minimum once nothing has waited,
run or been held for `idle_s`: never below the busy tasks, because ECS stops tasks of its own
choosing and a busy one's job would be handed back.

Only the rule lives here, so that the scale model runs the same code the deployment does:
trialbox.pipeline.scaler reads the demand and sets the ECS service's desired count with it
(functions/scaler, every SCALER_TICK_S; the twin's elastic pool runs it too)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trialbox.settings import SCALE_IN_IDLE_S


@dataclass(frozen=True)
class Demand:
    queued: int  # requests not yet admitted (the requests queue, visible and in flight)
    waiting: int  # admitted work not yet taken (the work queue, visible)
    running: int  # admitted and not released (the admission count)
    held: int  # sessions their hosts hold

    @property
    def total(self) -> int:
        return self.queued + self.waiting + self.running + self.held


@dataclass(frozen=True)
class PoolBounds:
    min_tasks: int
    max_tasks: int
    slots_per_task: int = 1
    idle_s: float = SCALE_IN_IDLE_S


def desired(demand: Demand, current: int, idle_for_s: float, bounds: PoolBounds) -> int:
    """The task count to set now. `idle_for_s`: how long `demand.total` has been 0."""
    needed = math.ceil(demand.total / bounds.slots_per_task)
    if needed > current:
        return min(bounds.max_tasks, needed)
    if demand.total == 0 and idle_for_s >= bounds.idle_s:
        return bounds.min_tasks
    return max(bounds.min_tasks, min(current, bounds.max_tasks))
