"""A discrete-time model of the deployed pipeline under a load, one second a step: requests
wait in the requests queue, admission starts them only on a free slot and only as fast as
the rate quotas let (Step Functions' transitions and StartExecution, the admission count's
shards), the pool grows and shrinks as its scaler decides every tick (or, for the step
policies deployed before it, as their alarms fire once a metric period), and Fargate launches
tasks at its own rate, each ready after its start time.

It models what the template configures (pool_scaling) and what the quotas say (quotas); what
it leaves out is listed in docs/scaling.md."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from trialbox.pipeline.admission import COUNT_SHARDS
from trialbox.pipeline.scaling import Demand, PoolBounds
from trialbox.pipeline.scaling import desired as desired_tasks
from trialbox.scalemodel.quotas import value
from trialbox.scalemodel.template import PoolScaling


@dataclass(frozen=True)
class Shape:
    """What one sample costs the rate quotas: measured on the twin (benchmarks/transitions.py)."""

    transitions: float  # billed Step Functions transitions
    starts: float  # StartExecution calls (1 alone; 1 / the batch's size in a batch)
    count_writes: float = 2.0  # transactional writes of the admission count (admit, release)


ALONE = Shape(transitions=4.0, starts=1.0)
SCALER_PERIOD_S = 60  # the scaler's schedule (EventBridge's least rate: a minute)


@dataclass(frozen=True)
class Load:
    jobs: int
    job_s: float
    idle_before_s: float = 0.0  # the pool idles this long before the burst (at its minimum)
    slots_per_task: int = 1
    per_s: float | None = None  # None: every job at once (a burst); else a steady stream

    @classmethod
    def concurrent(cls, sandboxes: int, job_s: float, for_s: float) -> Load:
        """A steady demand of `sandboxes` at once: jobs arrive at sandboxes / job_s a second."""
        per_s = sandboxes / job_s
        return cls(jobs=int(per_s * for_s), job_s=job_s, per_s=per_s)

    def arrived(self, t: float) -> int:
        if t < 0:
            return 0
        return self.jobs if self.per_s is None else min(self.jobs, int(self.per_s * (t + 1)))


@dataclass
class Outcome:
    first_result_s: float | None = None
    drained_s: float | None = None
    peak_tasks: int = 0
    peak_reached_s: float | None = None
    idle_task_hours: float = 0.0  # task-time after the drain until the pool is at its minimum
    task_hours: float = 0.0  # all task-time from the burst to the pool's minimum
    back_to_min_s: float | None = None
    admitted_per_s_peak: float = 0.0


def ceiling(shape: Shape) -> dict[str, float]:
    """Samples/s each rate quota allows alone; the least of them is the stack's ceiling. The
    admission count is COUNT_SHARDS items, each on a partition of its own."""
    count_writes = value("ddb_item_wcu_per_s") / value("ddb_transact_wcu") * COUNT_SHARDS
    return {
        "Step Functions transitions": value("sfn_transitions_per_s") / shape.transitions,
        "StartExecution": value("sfn_start_execution_per_s") / shape.starts,
        f"admission count ({COUNT_SHARDS} items)": count_writes / shape.count_writes,
    }


@dataclass
class _Bucket:
    per_s: float
    burst: float
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def refill(self, dt: float) -> None:
        self.tokens = min(self.burst, self.tokens + self.per_s * dt)


def simulate(
    load: Load,
    scaling: PoolScaling,
    shape: Shape = ALONE,
    limit_s: float = 30 * 86400,
    scaler: PoolBounds | None = None,
) -> Outcome:
    """`scaling`: the template's scaler (every its tick), or step policies; `scaler`: the
    scaler's rule (trialbox.pipeline.scaling) within these bounds instead, once a minute
    unless the template's scaler gives its tick."""
    out = Outcome()
    idle_since: float | None = None
    tick = scaling.tick_s if scaling.scaler is not None else SCALER_PERIOD_S
    if scaler is None and scaling.scaler is not None:  # its bounds: `scaling`'s, as replaced
        scaler = dataclasses.replace(
            scaling.scaler, min_tasks=scaling.min_tasks, max_tasks=scaling.max_tasks
        )
    period = min((p.period_s for p in scaling.policies), default=tick)
    start_s = value("fargate_task_start_s")
    launches = _Bucket(value("fargate_launch_per_s"), value("fargate_launch_burst"))
    rate = min(ceiling(shape).values())
    admits = _Bucket(rate, rate)  # one second's worth: the quotas' buckets are not modelled
    desired = ready = scaling.min_tasks
    starting: deque[float] = deque()  # ready times of launched tasks
    last_scaled = {p.name: -math.inf for p in scaling.policies}
    queued = running = done = admitted = 0
    ends: list[float] = []
    t = -load.idle_before_s
    drained_at: float | None = None
    while t < limit_s:
        busy = queued or running or starting or load.arrived(t) < load.jobs
        dt = 1.0 if busy or desired != ready else max(1.0, period - (t % period))
        launches.refill(dt)
        admits.refill(dt)
        while starting and starting[0] <= t:
            starting.popleft()
            ready += 1
        while ends and ends[0] <= t:
            heapq.heappop(ends)
            running -= 1
            done += 1
            if out.first_result_s is None:
                out.first_result_s = t
        if t >= 0:
            queued = load.arrived(t) - admitted
            free = ready * load.slots_per_task - running
            n = int(min(queued, free, admits.tokens))
            if n > 0:
                admits.tokens -= n
                admitted += n
                queued -= n
                running += n
                for _ in range(n):
                    heapq.heappush(ends, t + load.job_s)
                out.admitted_per_s_peak = max(out.admitted_per_s_peak, n / dt)
        if done == load.jobs and drained_at is None and t >= 0:
            drained_at = out.drained_s = t
        if scaler is not None and t % tick < dt:
            demand = Demand(queued=queued, waiting=0, running=running, held=0)
            if demand.total:
                idle_since = None
            elif idle_since is None:
                idle_since = t
            idle_for = 0.0 if idle_since is None else t - idle_since
            desired = desired_tasks(demand, ready + len(starting), idle_for, scaler)
        elif scaler is None and t % period < dt:  # the alarms, once a metric period
            metrics = {"queued": queued, "waiting": 0, "admitting": 0, "running": running,
                       "held": 0}  # fmt: skip
            for policy in scaling.policies:
                metric = sum(metrics.get(m, 0) for m in policy.metrics)
                change = policy.change(metric)
                if change and t - last_scaled[policy.name] >= policy.cooldown_s:
                    last_scaled[policy.name] = t
                    desired = max(scaling.min_tasks, min(scaling.max_tasks, desired + change))
        while ready + len(starting) < desired and launches.tokens >= 1:
            launches.tokens -= 1
            starting.append(t + start_s)
        if ready > desired:  # scale-in stops idle tasks (this template scales in only idle)
            ready = max(desired, math.ceil(running / load.slots_per_task))
        if ready > out.peak_tasks:
            out.peak_tasks, out.peak_reached_s = ready, t
        if t >= 0:
            out.task_hours += (ready + len(starting)) * dt / 3600
            if drained_at is not None:
                out.idle_task_hours += (ready + len(starting)) * dt / 3600
        if drained_at is not None and ready == scaling.min_tasks and not starting:
            out.back_to_min_s = t
            return out
        t += dt
    return out
