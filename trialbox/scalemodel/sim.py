"""A discrete-time model of the deployed pipeline under a load, one second a step (finer for
sub-second jobs: `step_s`): requests wait in the requests queue, admission starts them only on
a free slot and only as fast as the rate quotas let (Step Functions' transitions and
StartExecution, the admission count's shards), the pool grows and shrinks as its scaler
decides every tick (or, for the step policies deployed before it, as their alarms fire once
a metric period), and Fargate launches tasks at its own rate, each ready after its start
time.

Where latencies under a second matter (the local twin's short jobs), a `Path` adds what
surrounds a sample's sandbox run: the client's window and polls, the way to the dispatcher,
its admission poll and its one StartExecution per flush (retried as botocore retries a
throttle), the slot held beyond the run, and the result's way to the table.

It models what the template configures (pool_scaling) and what the quotas say (quotas); what
it leaves out is listed in docs/scaling.md."""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trialbox.aws_retries import MAX_ATTEMPTS
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


ALONE = Shape(transitions=3.0, starts=1.0)  # Prepare, Execute, Record (4 with a Score step)
# A session's open: a message on the open queue, through no state machine and no admission
# (its calls go to its worker's inbox; its grade, one batched sample, is left out).
SESSION = Shape(transitions=0.0, starts=0.0, count_writes=0.0)
SCALER_PERIOD_S = 60  # the scaler's schedule (EventBridge's least rate: a minute)
# botocore's standard retry mode (trialbox.aws_retries): before retry i (1-based) of a
# throttled call it sleeps rand(0, 1) * min(1 s * 2 ** (i - 1), 20 s); the model sleeps the mean.
THROTTLE_BASE_S = 1.0
MAX_BACKOFF_S = 20.0


def throttle_backoff_s(retry: int, draw: float = 0.5) -> float:
    """The sleep before the `retry`-th retry (1-based) of a throttled call: its mean, or the
    sleep for `draw` (botocore's rand(0, 1))."""
    return draw * min(THROTTLE_BASE_S * 2.0 ** (retry - 1), MAX_BACKOFF_S)


@dataclass(frozen=True)
class Path:
    """What surrounds a sample's sandbox run, where it is not negligible against the run (the
    twin's sub-second jobs). The defaults are the scale model's minute-scale view: none of it."""

    to_dispatcher_s: float = 0.0  # sent -> the dispatcher asks for its slot
    start_s: float = 0.0  # admitted -> its execution started (the slot is held meanwhile)
    slot_overhead_s: float = 0.0  # the slot is held this long beyond the sandbox run
    to_record_s: float = 0.0  # the slot given back -> the result in the table
    admit_poll_s: float = 0.0  # a dispatcher that found no slot asks again this often
    # One StartExecution a dispatcher flush (what it admitted together starts as one batch),
    # from the StartExecution quota's own bucket, and a throttled start retried (and the
    # dispatcher held) as botocore retries it; else StartExecution is a per-sample rate.
    start_per_flush: bool = False
    # None: a throttled call sleeps botocore's mean backoff; a seed: its jittered sleeps,
    # drawn (one path of many: average the model over seeds for the expected figures).
    retry_seed: int | None = None
    # The messages one dispatcher invocation is handed (its event source's batch size): it
    # admits them in turn and starts what it admitted before one waits and at its end; what
    # arrives meanwhile waits for the next. None: it admits whatever waits, at every step.
    dispatcher_batch: int | None = None
    # A batch's samples (several started by one flush) are given back by the finisher, one
    # message at a time, after each one's Score and Record (to_record_s): a sample alone is
    # given back by its worker, and scored and recorded after.
    finisher: bool = False
    client_window: int | None = None  # the client's requests in flight at most
    client_poll_s: float = 0.0  # the client's poll after activity (0: it sees results at once)
    client_poll_max_s: float = 0.0  # ... backing off 1.5-fold to this while nothing arrives
    client_poll_growth: float = 1.5


DIRECT = Path()


@dataclass(frozen=True)
class Load:
    jobs: int
    job_s: float
    idle_before_s: float = 0.0  # the pool idles this long before the burst (at its minimum)
    slots_per_task: int = 1
    per_s: float | None = None  # None: every job at once (a burst); else a steady stream
    # Measured run times (the twin's sandboxes): each job's run is one of them, drawn, as a
    # share of their median, times job_s. Their spread keeps the slots from ending in step.
    run_s: tuple[float, ...] = ()
    # The cores the runs share (the twin's sandboxes and processes, on one host): k slots
    # busy at once each get min(1, cores / k) of a core for their run and the path's slot
    # overhead (processor sharing). None: runs never slow each other (a task each).
    cores: float | None = None

    def run_time(self, k: int) -> float:
        """The `k`-th started job's run time alone: job_s, or job_s times a share of the
        measured spread drawn for it (seeded by k: the same draws every time; drawn, not taken
        in turn, so that the slots drift apart as the twin's do)."""
        if not self.run_s:
            return self.job_s
        median = sorted(self.run_s)[len(self.run_s) // 2]
        return self.job_s * random.Random(k).choice(self.run_s) / median

    @classmethod
    def concurrent(cls, sandboxes: int, job_s: float, for_s: float) -> Load:
        """A steady demand of `sandboxes` at once: jobs arrive at sandboxes / job_s a second."""
        per_s = sandboxes / job_s
        return cls(jobs=int(per_s * for_s), job_s=job_s, per_s=per_s)

    def arrived(self, t: float, step_s: float = 1.0) -> int:
        """Jobs submitted before the end of the step that starts at `t` (job i at i / per_s)."""
        if t < 0:
            return 0
        if self.per_s is None:
            return self.jobs
        return min(self.jobs, math.ceil(self.per_s * (t + step_s) - 1e-9))


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
    starts: int = 0  # StartExecution calls that went through (Path.start_per_flush)
    throttled: int = 0  # ... and that were throttled (each retried after a backoff)


def quota(name: str, quotas: Mapping[str, float] | None = None) -> float:
    """The quota table's value, or `quotas`' (a quota scaled up or down)."""
    return quotas[name] if quotas and name in quotas else value(name)


START_EXECUTION = "StartExecution"


def ceiling(shape: Shape, quotas: Mapping[str, float] | None = None) -> dict[str, float]:
    """Samples/s each rate quota allows alone; the least of them is the stack's ceiling. The
    admission count is COUNT_SHARDS items, each on a partition of its own."""
    count_writes = (
        quota("ddb_item_wcu_per_s", quotas) / quota("ddb_transact_wcu", quotas) * COUNT_SHARDS
    )

    def per(refill: float, cost: float) -> float:
        return refill / cost if cost else math.inf  # a sample that costs the quota nothing

    return {
        "Step Functions transitions": per(
            quota("sfn_transitions_per_s", quotas), shape.transitions
        ),
        START_EXECUTION: per(quota("sfn_start_execution_per_s", quotas), shape.starts),
        f"admission count ({COUNT_SHARDS} items)": per(count_writes, shape.count_writes),
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
    path: Path = DIRECT,
    step_s: float = 1.0,
    quotas: Mapping[str, float] | None = None,
) -> Outcome:
    """`scaling`: the template's scaler (every its tick), or step policies; `scaler`: the
    scaler's rule (trialbox.pipeline.scaling) within these bounds instead, once a minute
    unless the template's scaler gives its tick. `path`: the latencies around a sample's run
    (DIRECT: none); `step_s`: the model's step; `quotas`: quota values in place of the
    table's (a quota scaled down)."""
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
    limits = ceiling(shape, quotas)
    if path.start_per_flush:  # StartExecution is a bucket of its own, a call per flush
        del limits[START_EXECUTION]
    starts = _Bucket(
        quota("sfn_start_execution_per_s", quotas), quota("sfn_start_execution_bucket", quotas)
    )
    rate = min(limits.values())
    admits = _Bucket(rate, rate)  # one second's worth: the quotas' buckets are not modelled
    desired = ready = scaling.min_tasks
    starting: deque[float] = deque()  # ready times of launched tasks
    last_scaled = {p.name: -math.inf for p in scaling.policies}
    queued = running = done = admitted = 0
    sent = reached = seen = 0  # by the client; at the dispatcher; results the client saw
    reaching: deque[float] = deque()  # when each sent request reaches the dispatcher
    recorded: list[float] = []  # when each released sample's result is in the table (a heap)
    ends: list[float] = []
    next_ask = -math.inf  # a dispatcher that found no slot asks again then
    flush: list[float] = []  # [admitted, its retry, retry at]: a start not through yet
    held = 0  # admitted by the dispatcher, not started yet
    invocation = 0  # the messages left of the dispatcher's invocation (path.dispatcher_batch)
    next_poll, poll_s = math.inf, path.client_poll_s
    begun = 0
    draws = random.Random(path.retry_seed)

    def jitter() -> float:
        return 0.5 if path.retry_seed is None else draws.random()

    sharing: list[list[Any]] = []  # [work left, batched] of each hold on the shared cores
    batch_ends: list[float] = []  # when each batched sample's run ends (path.finisher)
    finishing: deque[float] = deque()  # when the finisher gives each one's slot back
    finisher_at = -math.inf  # the finisher is busy until then (one message at a time)

    def begin(n: int, at: float) -> None:
        """`n` admitted jobs start their runs (their slots were taken at admission), as one
        batch when there are several and the finisher releases batches (path.finisher)."""
        nonlocal begun
        batched = path.finisher and n > 1
        for _ in range(n):
            hold = path.start_s + load.run_time(begun) + path.slot_overhead_s
            if load.cores is not None:  # the slot's whole hold is the host's work, shared
                sharing.append([hold, batched])
            else:
                heapq.heappush(batch_ends if batched else ends, at + hold)
            begun += 1

    t = -load.idle_before_s
    drained_at: float | None = None
    while t < limit_s:
        arrived = load.arrived(t, step_s)
        busy = queued or running or starting or arrived < load.jobs
        # What arrived and is not admitted yet (a burst, at its first step) keeps it busy too.
        busy = bool(busy or arrived > admitted or reaching or recorded or seen < sent or sharing)
        busy = busy or bool(batch_ends or finishing)
        dt = step_s if busy or desired != ready else max(step_s, period - (t % period))
        launches.refill(dt)
        admits.refill(dt)
        starts.refill(dt)
        while starting and starting[0] <= t:
            starting.popleft()
            ready += 1
        if sharing and load.cores is not None:  # the runs on shared cores, a step further
            share = min(1.0, load.cores / len(sharing)) * dt
            for hold in sharing:
                hold[0] -= share
                if hold[0] <= 1e-9:
                    heapq.heappush(batch_ends if hold[1] else ends, t)
            sharing[:] = [hold for hold in sharing if hold[0] > 1e-9]
        while ends and ends[0] <= t:
            end = heapq.heappop(ends)
            running -= 1
            done += 1
            heapq.heappush(recorded, end + path.to_record_s)
        while batch_ends and batch_ends[0] <= t:  # the finisher: Score, Record, the release
            finisher_at = max(finisher_at, heapq.heappop(batch_ends)) + path.to_record_s
            finishing.append(finisher_at)
        while finishing and finishing[0] <= t:
            heapq.heappush(recorded, finishing.popleft())
            running -= 1
            done += 1
        arrived_now = 0
        if not path.client_poll_s or t >= next_poll:  # the client's poll: what it sees now
            while recorded and recorded[0] <= t:
                heapq.heappop(recorded)
                arrived_now += 1
            if path.client_poll_s:
                growth = poll_s * path.client_poll_growth
                poll_s = path.client_poll_s if arrived_now else min(path.client_poll_max_s, growth)
                next_poll = t + poll_s
        if arrived_now:
            if out.first_result_s is None:
                out.first_result_s = t
            seen += arrived_now
        if t >= 0:
            room = math.inf if path.client_window is None else path.client_window - (sent - seen)
            n = int(min(load.arrived(t, step_s) - sent, room))
            if n > 0:  # sent, and the client polls a first poll's delay after
                sent += n
                reaching.extend([t + path.to_dispatcher_s] * n)
                if path.client_poll_s:
                    poll_s, next_poll = path.client_poll_s, min(next_poll, t + path.client_poll_s)
            while reaching and reaching[0] <= t:
                reaching.popleft()
                reached += 1
            queued = reached - admitted
            if flush and t >= flush[2]:  # a throttled start, retried
                if starts.tokens >= 1:
                    starts.tokens -= 1
                    out.starts += 1
                    begin(int(flush[0]), t)
                    flush = []
                elif flush[1] + 1 < MAX_ATTEMPTS:
                    out.throttled += 1
                    flush[1] += 1
                    flush[2] = t + throttle_backoff_s(int(flush[1]), jitter())
            free = ready * load.slots_per_task - running
            # What the dispatcher may admit now: all that waits, or what is left of the
            # messages its invocation was handed (path.dispatcher_batch).
            if path.dispatcher_batch is not None and not invocation and not flush:
                invocation = min(queued, path.dispatcher_batch)
            offered = queued if path.dispatcher_batch is None else invocation
            asks = not flush and t >= next_ask and offered > 0
            n = int(min(offered, free, admits.tokens)) if asks else 0
            if n > 0:
                admits.tokens -= n
                admitted += n
                queued -= n
                running += n
                held += n
                if path.dispatcher_batch is not None:
                    invocation -= n
                out.admitted_per_s_peak = max(out.admitted_per_s_peak, n / dt)
            waits = asks and offered > n  # no slot for the next: it asks again a poll on
            if waits:
                next_ask = t + path.admit_poll_s
            # What it admitted starts before a request waits, or as its invocation ends.
            if held and (waits or path.dispatcher_batch is None or not invocation):
                if not path.start_per_flush:
                    begin(held, t)
                elif starts.tokens >= 1:
                    starts.tokens -= 1
                    out.starts += 1
                    begin(held, t)
                else:  # throttled: botocore sleeps, and the dispatcher with it
                    out.throttled += 1
                    flush = [held, 1, t + throttle_backoff_s(1, jitter())]
                held = 0
        if seen == load.jobs and drained_at is None and t >= 0:
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
