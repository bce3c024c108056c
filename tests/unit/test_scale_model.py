"""The scale model (trialbox.scalemodel) on the synthesized template: it reads the pool's
scaler as deployed, and, on the step scaling deployed before it (STEP_POLICIES, read from
that template as CloudFormation would apply it), reproduces the audit's figures
(../shared/research/scale-audit.md): about 375 samples/s of transitions, about 205 min from
idle to 4,096 tasks, about 280,000 idle task-hours after that peak."""

from __future__ import annotations

import dataclasses

import pytest

from trialbox.pipeline.scaling import Demand, PoolBounds, desired
from trialbox.scalemodel.sim import ALONE, Load, Shape, ceiling, simulate
from trialbox.scalemodel.template import STEP_POLICIES, pool_scaling


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
    assert ceiling(ALONE)["Step Functions transitions"] == pytest.approx(375)


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
