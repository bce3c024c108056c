"""Dollars per million samples, counted from calls: a twin with its request log on runs
`--samples` jobs of `--job-s` seconds (`sleep`, then grading), first one at a time (each its
own Rollout: the baseline), then all together (batches). Every call the run made, the SDK's
and the stack's, is priced by its service's billing unit (trialbox.scalemodel.cost), Step
Functions by the billed transitions in the histories, Fargate Spot by the job's seconds + 1,
and the idle tail by the scale model (today's scaling: 1,000 sandboxes of these jobs for
30 minutes). Beside: E2B's and Modal's list prices for the same sandbox-seconds.
Then sessions: one session makes `--session-calls` calls (`true`), priced per million calls;
and the calls made while a session sits idle for `--idle-s`, less those of the same wait
with no session open (the pool's own polls), priced per session-hour.
Run: `.venv/bin/python benchmarks/cost.py --samples 16 --workers 4 --job-s 10`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from trialbox import constants as c
from trialbox.local.requestlog import ENV_REQUEST_LOG, calls
from trialbox.local.twin import LocalTwin
from trialbox.metering import machine_transitions
from trialbox.models import ExecutionRequest, Task
from trialbox.scalemodel.cost import fargate_dollars, itemize
from trialbox.scalemodel.quotas import PRICES
from trialbox.scalemodel.sim import Load, simulate
from trialbox.scalemodel.template import pool_scaling
from trialbox.sdk import Client

MILLION = 1e6
TASK = {
    "task_id": "add",
    "hidden_tests": {"tests/test_add.py": "from solution import add\n\n\ndef test_add():\n"
                     "    assert add(1, 2) == 3\n"},
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}  # fmt: skip


def billed(twin: LocalTwin) -> int:
    """Billed transitions so far, of both state machines."""
    sfn = twin.client("stepfunctions")
    arns = (twin.output(c.OUTPUT_BATCH_ARN), twin.output(c.OUTPUT_ROLLOUT_ARN))
    return sum(machine_transitions(sfn, arn)[1] for arn in arns)


def job(request_id: str, job_s: float) -> ExecutionRequest:
    body = {
        "request_id": request_id,
        "task": TASK | {"limits": {"timeout_s": job_s + 30, "memory_mb": 512}},
        "files": {"solution.py": "def add(a, b):\n    return a + b\n"},
        "commands": [["sleep", str(job_s)]],
    }
    return ExecutionRequest.model_validate(body)


def session_windows(
    client: Client, log: Path, n_calls: int, idle_s: float
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The request log's lines of: a session's `n_calls` calls; `idle_s` of it sitting idle;
    the same wait with no session open."""
    add = Task.model_validate(TASK | {"workspace": {"solution.py": "def add(a, b): ...\n"}})
    with client.session(add, ttl_s=600) as s:
        s.exec(["true"])  # its workspace made: the calls counted are steady ones
        start = len(calls(log))
        for _ in range(n_calls):
            s.exec(["true"])
        called = len(calls(log))
        time.sleep(idle_s)
        idled = len(calls(log))
    time.sleep(5)  # the close's reply and trace are out of the quiet window
    quiet = len(calls(log))
    time.sleep(idle_s)
    return (start, called), (called, idled), (quiet, len(calls(log)))


def idle_per_sample(job_s: float) -> float:
    """Dollars of idle task time per sample: the model's tail after 1,000 sandboxes of these
    jobs for 30 minutes, on today's template's scaling, shared over the jobs it ran."""
    pool = dataclasses.replace(pool_scaling(), max_tasks=1000)
    load = Load.concurrent(1000, job_s, 1800)
    return fargate_dollars(simulate(load, pool).idle_task_hours * 3600) / load.jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--job-s", type=float, default=10.0)
    parser.add_argument("--session-calls", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="trialbox-cost-")) / "requests.jsonl"
    os.environ[ENV_REQUEST_LOG] = str(log)
    phases: dict[str, tuple[int, int, int]] = {}
    with Client.local(workers=args.workers) as client:
        twin = client.aio._twin
        assert twin is not None
        twin.leased(args.workers)
        for phase in ("alone", "together"):
            lines, before = len(calls(log)), billed(twin)
            requests = [job(f"{phase}-{n}", args.job_s) for n in range(args.samples)]
            if phase == "alone":
                for request in requests:
                    client.run([request], timeout=300)
            else:
                client.run(requests, timeout=600)
            phases[phase] = (lines, len(calls(log)), billed(twin) - before)
        session = session_windows(client, log, args.session_calls, args.idle_s)
    recorded = calls(log)
    compute = fargate_dollars(args.job_s + 1)
    idle = idle_per_sample(args.job_s)
    print(f"$ per 1M samples of {args.job_s:g} s, {args.samples} samples a phase, "
          f"{args.workers} workers (calls from the twin's request log)")  # fmt: skip
    for phase, (start, end, transitions) in phases.items():
        by_service, counted = itemize(recorded[start:end])
        rows = {name: dollars / args.samples * MILLION for name, dollars in by_service.items()}
        rows["stepfunctions"] = transitions * PRICES["sfn_transition"].value / args.samples
        rows["stepfunctions"] *= MILLION
        rows["fargate spot (job + 1 s)"] = compute * MILLION
        rows["idle tail (model)"] = idle * MILLION
        print(f"\n{phase}: {sum(counted.values()) / args.samples:.1f} calls and "
              f"{transitions / args.samples:.3f} transitions a sample")  # fmt: skip
        for name, value in sorted(rows.items(), key=lambda kv: -kv[1]):
            print(f"  {name:28} {value:10,.2f}")
        print(f"  {'total':28} {sum(rows.values()):10,.2f}")
        top = ", ".join(f"{s}:{o} {n / args.samples:.1f}" for (s, o), n in counted.most_common(8))
        print(f"  most calls a sample: {top}")
    (start, called), (idle_start, idle_end), (quiet_start, quiet_end) = session
    per_call, counted = itemize(recorded[start:called])
    n = args.session_calls
    items = ", ".join(f"{k} {v / n * MILLION:,.2f}" for k, v in per_call.items())
    print(f"\nsessions: {sum(counted.values()) / n:.1f} calls a session call, "
          f"${sum(per_call.values()) / n * MILLION:,.2f} per 1M calls ({items})")  # fmt: skip
    idle, _ = itemize(recorded[idle_start:idle_end])
    quiet, _ = itemize(recorded[quiet_start:quiet_end])
    hourly = max(0.0, sum(idle.values()) - sum(quiet.values())) * 3600 / args.idle_s
    print(
        f"  {args.idle_s:g} s of an idle session: {idle_end - idle_start} calls; the same wait "
        f"with none open: {quiet_end - quiet_start} (the pool's own polls); what it adds: "
        f"${hourly * 1000:,.2f} per 1,000 session-hours (plus its task-hour under rlimit)"
    )
    for name in ("e2b_second", "modal_second"):
        print(
            f"{name.split('_')[0]:>6} list price: {PRICES[name].value * args.job_s * MILLION:,.2f}"
        )


if __name__ == "__main__":
    main()
