"""The scale model (trialbox.scalemodel; docs/scaling.md) on the synthesized template: the
rate ceilings each quota puts on samples/s, the audit's figures reproduced, and the issue's
scenarios (1k and 10k sandboxes of 10 s and 60 s jobs, 30 minutes of demand; a GRPO step of
4,096 sessions opened at once after 10 idle minutes, each holding a task under rlimit).
Run: `.venv/bin/python benchmarks/scale_model.py`.
"""

from __future__ import annotations

import dataclasses

from trialbox.scalemodel.cost import fargate_dollars
from trialbox.scalemodel.quotas import value
from trialbox.scalemodel.sim import ALONE, SESSION, Load, Shape, ceiling, simulate
from trialbox.scalemodel.template import STEP_POLICIES, pool_scaling

# Measured on the twin: benchmarks/transitions.py --size 8 (0.125 a sample, one start a batch).
BATCHED = Shape(transitions=0.125, starts=1 / 8)
SESSIONS = 4096  # a GRPO step: 4,096 sessions at once
SESSION_S = 600.0  # each one's episode of tool calls
AUDIT = {"ceiling": 375.0, "minutes_to_4096": 205.0, "idle_task_hours": 280_000.0}


def main() -> None:
    template = pool_scaling()
    print(f"template: min {template.min_tasks}, max {template.max_tasks} tasks; the scaler "
          f"every {template.tick_s:g} s, in after {template.scaler and template.scaler.idle_s:g} "
          "s idle")  # fmt: skip
    print("\nceiling, samples/s, by quota:")
    for name, shape in (("alone", ALONE), ("batches of 8", BATCHED)):
        limits = ceiling(shape)
        first = min(limits, key=limits.__getitem__)
        shown = ", ".join(f"{k} {v:,.0f}" for k, v in limits.items())
        print(f"  {name:13} {limits[first]:8,.0f}  (first: {first}; {shown})")

    print("\nthe audit's figures, on the step policies (before the scaler), max_workers 4,096:")
    wide = dataclasses.replace(STEP_POLICIES, max_tasks=4096)
    run = simulate(Load.concurrent(4096, 60, 6 * 3600), wide)
    assert run.peak_reached_s is not None
    rows = [
        ("Step Functions transitions ceiling (4 a sample, as audited)", AUDIT["ceiling"],
         ceiling(dataclasses.replace(ALONE, transitions=4.0))["Step Functions transitions"]),
        ("minutes from idle to 4,096 tasks", AUDIT["minutes_to_4096"], run.peak_reached_s / 60),
        ("idle task-hours after a 4,096 peak", AUDIT["idle_task_hours"], run.idle_task_hours),
    ]  # fmt: skip
    for what, audit, model in rows:
        print(
            f"  {what:50} audit {audit:>10,.0f}   model {model:>10,.0f}   ratio {model / audit:.3f}"
        )
    today = dataclasses.replace(template, max_tasks=4096)
    elastic = simulate(Load.concurrent(4096, 60, 6 * 3600), today)
    print("the same load under the deployed scaler (trialbox.pipeline.scaler):")
    print(f"  minutes from idle to 4,096 tasks {(elastic.peak_reached_s or 0) / 60:.1f}; "
          f"idle task-hours after the peak {elastic.idle_task_hours:,.0f}")  # fmt: skip

    print("\nscenarios (30 min of demand; max_workers = the demand, at most 5,000 a service):")
    print(f"  {'load, scaling':24} {'first result':>10} {'drained':>9} {'peak':>6} {'to peak':>8} "
          f"{'idle task-h':>11} {'Spot $':>9}")  # fmt: skip
    for sandboxes, job_s, scaler in (
        (n, s, e) for e in (False, True) for n in (1000, 10_000) for s in (10, 60)
    ):
        most = min(sandboxes, int(value("ecs_tasks_per_service")))
        pool = dataclasses.replace(template if scaler else STEP_POLICIES, max_tasks=most)
        out = simulate(Load.concurrent(sandboxes, job_s, 1800), pool)
        print(
            f"  {sandboxes:>6,} x {job_s:>2} s {'elastic' if scaler else 'steps  '}"
            f"{out.first_result_s or 0:>10.0f} s "
            f"{(out.drained_s or 0) / 60:>7.0f} m {out.peak_tasks:>6,} "
            f"{(out.peak_reached_s or 0) / 60:>6.0f} m {out.idle_task_hours:>11,.0f} "
            f"{fargate_dollars(out.task_hours * 3600):>9,.0f}"
        )
    steps = dataclasses.replace(STEP_POLICIES, max_tasks=SESSIONS)
    for name, pool in (
        ("steps  ", steps),
        ("elastic", dataclasses.replace(template, max_tasks=SESSIONS)),
    ):
        burst = Load(jobs=SESSIONS, job_s=SESSION_S, idle_before_s=600)
        out = simulate(burst, pool, shape=SESSION)
        print(
            f"  {SESSIONS:,} sessions {name} "
            f"{out.first_result_s or 0:>8.0f} s {(out.drained_s or 0) / 60:>7.0f} m "
            f"{out.peak_tasks:>6,} {(out.peak_reached_s or 0) / 60:>6.0f} m "
            f"{out.idle_task_hours:>11,.0f} {fargate_dollars(out.task_hours * 3600):>9,.0f}"
        )
    print(f"  (a session: {SESSION_S / 60:g} min of tool calls on a task of its own, opened after "
          "10 idle minutes;\n  first result: the first session done; Spot $: all task-hours, "
          "idle and the warm minimum included)")  # fmt: skip
    print("\nplatform errors: none in the model (throttled calls are retried, never failed);")
    print("not modelled: throttling past the rate quotas' refills, cost by API call (that is")
    print("benchmarks/cost.py, counted on the twin).")


if __name__ == "__main__":
    main()
