"""The scale model (trialbox.scalemodel) on the synthesized template: it reads the pool's
scaler as deployed, and, on the step scaling deployed before it (STEP_POLICIES, read from
that template as CloudFormation would apply it), reproduces the audit's figures
(../shared/research/scale-audit.md): about 375 samples/s of transitions, about 205 min from
idle to 4,096 tasks, about 280,000 idle task-hours after that peak."""

from __future__ import annotations

import dataclasses

import pytest

from trialbox.pipeline.scaling import Demand, PoolBounds, desired
from trialbox.scalemodel.sim import ALONE, Load, Path, Shape, ceiling, simulate, throttle_backoff_s
from trialbox.scalemodel.template import STEP_POLICIES, PoolScaling, pool_scaling


def test_today_s_template_is_read_as_its_scaler() -> None:
    scaling = pool_scaling()
    assert scaling.policies == ()
    assert scaling.scaler == PoolBounds(min_tasks=0, max_tasks=10, slots_per_task=1, idle_s=300)
    assert (scaling.min_tasks, scaling.max_tasks, scaling.tick_s) == (0, 10, 10)


def test_the_old_step_scaling_is_read_with_aws_s_step_bounds() -> None:
    scaling = STEP_POLICIES
    out, idle = sorted(scaling.policies, key=lambda p: p.cooldown_s)
    assert (out.cooldown_s, idle.cooldown_s, out.period_s) == (60, 120, 60)
    assert [out.change(v) for v in (0, 1, 19, 20, 99, 100)] == [0, 1, 1, 5, 5, 20]
    assert [idle.change(v) for v in (0, 1)] == [-1, 0]
    assert {"queued", "admitting", "waiting"} <= out.metrics
    assert "held" in idle.metrics and "held" not in out.metrics


def test_the_model_reproduces_the_audit_on_the_step_policies() -> None:
    pool = dataclasses.replace(STEP_POLICIES, max_tasks=4096)
    run = simulate(Load.concurrent(4096, 60, 6 * 3600), pool)
    assert run.peak_tasks == 4096 and run.peak_reached_s is not None
    assert run.peak_reached_s / 60 == pytest.approx(205, rel=0.05)
    assert run.idle_task_hours == pytest.approx(280_000, rel=0.05)
    # The audit's 375/s was at 4 transitions a sample (a Score step of its own); 3 now.
    four = dataclasses.replace(ALONE, transitions=4.0)
    assert ceiling(four)["Step Functions transitions"] == pytest.approx(375)
    assert ceiling(ALONE)["Step Functions transitions"] == pytest.approx(500)


def test_the_ceiling_is_the_least_quota_and_the_model_never_passes_it() -> None:
    batched = Shape(transitions=0.125, starts=1 / 8)
    limits = ceiling(batched)
    assert limits["Step Functions transitions"] == pytest.approx(12_000)
    pool = dataclasses.replace(STEP_POLICIES, min_tasks=2000, max_tasks=2000)
    run = simulate(Load(jobs=20_000, job_s=10), pool, batched)
    assert run.admitted_per_s_peak <= min(limits.values()) + 1e-9
    assert run.drained_s is not None and run.drained_s >= 20_000 / min(limits.values())


def test_the_elastic_scaler_grows_with_the_work_and_shrinks_only_after_idle() -> None:
    bounds = PoolBounds(min_tasks=2, max_tasks=100, slots_per_task=1, idle_s=300)
    busy = Demand(queued=40, waiting=5, running=10, held=3)
    assert desired(busy, current=2, idle_for_s=0, bounds=bounds) == 58  # at once, in proportion
    assert desired(Demand(500, 0, 0, 0), current=2, idle_for_s=0, bounds=bounds) == 100
    quiet = Demand(0, 0, 3, 0)  # less work than tasks, but some: never stop a busy task
    assert desired(quiet, current=58, idle_for_s=0, bounds=bounds) == 58
    idle = Demand(0, 0, 0, 0)
    assert desired(idle, current=58, idle_for_s=299, bounds=bounds) == 58
    assert desired(idle, current=58, idle_for_s=300, bounds=bounds) == 2  # the warm minimum


def test_the_model_on_today_s_template_meets_the_issue_s_pool_targets() -> None:
    """Issue 24: idle to 4,096 tasks within 6 minutes (Fargate's launch rate, not a step
    policy), at most 500 idle task-hours after a 4,096 peak: the deployed scaler, read from
    the template (its bounds, idle time and tick), with max_workers 4,096."""
    today = pool_scaling()
    assert today.scaler is not None
    pool = dataclasses.replace(today, max_tasks=4096)
    run = simulate(Load.concurrent(4096, 60, 6 * 3600), pool)
    assert run.peak_tasks == 4096 and run.peak_reached_s is not None
    assert run.peak_reached_s <= 6 * 60
    assert run.idle_task_hours <= 500


def _fixed(workers: int) -> PoolScaling:
    return dataclasses.replace(pool_scaling(), min_tasks=workers, max_tasks=workers)


def test_a_fixed_pool_drains_n_short_jobs_in_n_times_s_over_w() -> None:
    """The twin's case: a fixed pool, sub-second jobs sent at once, a step finer than 1 s."""
    run = simulate(Load(jobs=40, job_s=0.5), _fixed(4), limit_s=600, step_s=0.01)
    assert run.drained_s == pytest.approx(40 * 0.5 / 4, rel=0.05)


def test_the_path_around_a_run_adds_its_latencies_to_the_drain() -> None:
    """One job alone: sent, reaches the dispatcher, holds its slot for the run and beyond,
    reaches the table, and the client sees it at its next poll (0.2 s after the send, then
    0.3 s later)."""
    path = Path(to_dispatcher_s=0.05, slot_overhead_s=0.05, to_record_s=0.1, client_poll_s=0.2,
                client_poll_max_s=2.0)  # fmt: skip
    run = simulate(Load(jobs=1, job_s=0.2), _fixed(1), limit_s=60, path=path, step_s=0.01)
    assert run.drained_s == pytest.approx(0.5, abs=0.02)  # recorded at 0.4, polled at 0.5
    windowed = dataclasses.replace(path, client_window=1, client_poll_s=0.0)
    run = simulate(Load(jobs=4, job_s=0.2), _fixed(4), limit_s=60, path=windowed, step_s=0.01)
    assert run.drained_s == pytest.approx(4 * 0.4, abs=0.05)  # one at a time: the window


def test_a_throttled_start_holds_the_dispatcher_for_botocore_s_backoff() -> None:
    """StartExecution scaled down to 0.5/s with a bucket of 1, one start a flush: one worker
    runs 6 short jobs in about 6 starts, each after the throttled retries' mean sleeps
    (0.5 + 1 + 2 s: the third retry finds the token that came 2 s after the last)."""
    path = Path(start_per_flush=True)
    quotas = {"sfn_start_execution_per_s": 0.5, "sfn_start_execution_bucket": 1.0}
    run = simulate(
        Load(jobs=6, job_s=0.1), _fixed(1), limit_s=600, path=path, step_s=0.01, quotas=quotas
    )
    assert run.drained_s == pytest.approx(0.1 + 5 * 3.5, rel=0.05)
    assert throttle_backoff_s(1) == 0.5 and throttle_backoff_s(10) == 10.0
    assert throttle_backoff_s(3, draw=1.0) == 4.0  # botocore's rand(0, 1) * 1 s * 2 ** 2
    jittered = [
        simulate(
            Load(jobs=6, job_s=0.1), _fixed(1), limit_s=600, step_s=0.01, quotas=quotas,
            path=dataclasses.replace(path, retry_seed=seed),
        ).drained_s or 0.0
        for seed in range(20)
    ]  # fmt: skip
    # Jittered, a retry lands nearer the token than the mean sleeps do: sooner on average.
    assert 0.1 + 5 * 2.0 < sum(jittered) / 20 < 0.1 + 5 * 3.5


def test_runs_on_shared_cores_slow_each_other_and_spread_as_measured() -> None:
    """The twin's sandboxes share the host's cores: 4 runs of 1 s alone on 2 cores take 2 s
    together; alone on 4 workers, as on 4 tasks, 1 s. The measured spread is kept as shares
    of its median, drawn for each job: the slots end at different times, as the twin's do."""
    burst = Load(jobs=4, job_s=1.0)
    assert simulate(burst, _fixed(4), limit_s=60, step_s=0.01).drained_s == pytest.approx(1.0)
    shared = dataclasses.replace(burst, cores=2.0)
    run = simulate(shared, _fixed(4), limit_s=60, step_s=0.01)
    assert run.drained_s == pytest.approx(2.0, abs=0.02)
    spread = Load(jobs=60, job_s=2.0, run_s=(0.5, 1.0, 1.5))
    drawn = [spread.run_time(k) for k in range(60)]
    assert set(drawn) == {1.0, 2.0, 3.0} and drawn == [spread.run_time(k) for k in range(60)]
    run = simulate(spread, _fixed(3), limit_s=600, step_s=0.01)
    assert run.drained_s == pytest.approx(sum(drawn) / 3, rel=0.1)


def test_the_dispatcher_starts_what_its_invocation_admitted_and_the_finisher_gives_back() -> None:
    """Two jobs at once on two workers: one invocation admits both and starts them as one
    batch (one StartExecution); the finisher gives their slots back one after the other,
    each after its Score and Record (0.1 s). Handed one message an invocation, the
    dispatcher starts each alone, and each worker gives its own back at once."""
    path = Path(to_record_s=0.1, start_per_flush=True, dispatcher_batch=10, finisher=True)
    pair = Load(jobs=2, job_s=0.5)
    run = simulate(pair, _fixed(2), limit_s=60, path=path, step_s=0.01)
    assert run.starts == 1 and run.drained_s == pytest.approx(0.5 + 2 * 0.1, abs=0.02)
    alone = dataclasses.replace(path, dispatcher_batch=1)
    run = simulate(pair, _fixed(2), limit_s=60, path=alone, step_s=0.01)
    assert run.starts == 2 and run.drained_s == pytest.approx(0.5 + 0.1, abs=0.02)
