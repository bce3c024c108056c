"""Session tool calls on the local twin: per-call overhead, restores and failover, in one run.

One twin (`Client.local(workers=2)`), every command `python -c pass` (the add-two task's
workspace, the tests' ADD_TASK). Latencies are wall time seen by the caller (perf_counter).
1. Per-call overhead: a session (`Client.session`), 3 warm-up `s.exec` calls, then N timed
   ones. Overhead = the caller's latency minus the command's own `wall_s` (the sandbox run):
   the SQS round trips, the worker's checkpoint and trace upload, the client's polling.
2. Baselines, same run: (a) bare bwrap exec, `Runner().exec(argv, Limits())` in this process,
   interleaved one for one with the session calls of 1 (so both see the same load); (b) the
   one-execution-per-step path, `client.run([ExecutionRequest(commands=[argv], grade=False)])`
   (a whole Step Functions execution each; 1 warm-up, then `--executions` timed). Ratios: the
   session's overhead against a bare exec, the session's latency against one execution's.
3. Restore after an idle release: a session with `idle_release_s=1`; `--restores` times a call
   (workspace held), 2.5 s of sleep (the worker checkpoints and frees the slot), then a timed
   call: its `restored_s` (the worker's restore of the checkpoint) and its whole latency.
4. Failover after a worker's death: in a session, a call, then `twin.pool.kill()` (SIGKILL of
   every worker; the pool replaces them), then the next call timed until it returns: the
   client hears nothing for FAILOVER_S, reopens the session on a new worker from its last
   checkpoint and sends the call again. Runs last, since it kills the pool.
5. Sessions per worker: `--sessions` K sessions opened at once from K threads, each then 5
   calls with 0.1 s of think time; which workers served them, and the calls/s of the call
   phase (from the last open to the last call's answer).
Restore and failover calls go through `s.step(commands=[argv])` (what `s.exec` sends) for the
CallResult's `restored_s` and `worker`. Figures and ratios only: no timing asserts; an error
exits non-zero with its traceback. About 2 minutes with the defaults. Run: `make bench`, or
`.venv/bin/python benchmarks/session_calls.py -n 50 --sessions 8`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trialbox.models import ExecutionRequest, Limits, Status, Task
from trialbox.models.report import CommandResult
from trialbox.models.sessions import FAILOVER_S, CallResult
from trialbox.sandbox.runner import Runner
from trialbox.sdk import Client
from trialbox.sdk.sync import Session

# add-two, the examples' first task (the one examples/grpo_group.py grades).
TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks.jsonl"
ADD_TASK: dict[str, Any] = json.loads(TASKS.read_text().splitlines()[0])
ARGV = ["python", "-c", "pass"]
WORKERS = 2
WARMUP = 3
TTL_S = 600.0
IDLE_SLEEP_S = 2.5
CALLS_PER_SESSION = 5
THINK_S = 0.1


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), linear between the closest ranks."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(pct(values, 0.5) * 1000, 1),
        "p95_ms": round(pct(values, 0.95) * 1000, 1),
    }


def command(result: CommandResult | CallResult) -> CommandResult:
    """The command's result; a platform failure (a CallResult) or a failed command raises."""
    if not isinstance(result, CommandResult):
        raise RuntimeError(f"the call failed: {result.status}: {result.error}")
    if result.status != Status.SUCCEEDED or result.exit_code != 0:
        raise RuntimeError(f"{result.argv}: {result.status}, exit {result.exit_code}")
    return result


def step(session: Session) -> tuple[CallResult, float]:
    """One call of one command, checked: its CallResult and the caller's latency."""
    start = time.perf_counter()
    result = session.step(commands=[ARGV])
    latency = time.perf_counter() - start
    if result.status != Status.SUCCEEDED or not result.commands:
        raise RuntimeError(f"call {result.seq} failed: {result.status}: {result.error}")
    command(result.commands[0])
    return result, latency


def per_call(client: Client, task: Task, runner: Runner, n: int) -> dict[str, Any]:
    """1 and 2a: session calls interleaved with bare bwrap execs."""
    latency: list[float] = []
    overhead: list[float] = []
    bare: list[float] = []
    bare_overhead: list[float] = []
    with client.session(task, ttl_s=TTL_S) as s:
        for _ in range(WARMUP):
            command(s.exec(ARGV))
            command(runner.exec(ARGV, Limits()))
        for _ in range(n):
            start = time.perf_counter()
            result = command(s.exec(ARGV))
            took = time.perf_counter() - start
            latency.append(took)
            overhead.append(took - result.wall_s)
            start = time.perf_counter()
            result = command(runner.exec(ARGV, Limits()))
            took = time.perf_counter() - start
            bare.append(took)
            bare_overhead.append(took - result.wall_s)
        worker = s.worker
    return {
        "calls": n,
        "worker": worker,
        "session_latency": ms(latency),
        "session_overhead": ms(overhead),
        "bare_exec": ms(bare),
        "bare_exec_overhead": ms(bare_overhead),
    }


def one_execution(client: Client, task: Task, n: int) -> dict[str, Any]:
    """2b: one Step Functions execution per step, no grading."""
    prefix = f"bench-sc-{uuid.uuid4().hex[:12]}"
    latency: list[float] = []
    for i in range(n + 1):  # the first warms the functions' processes
        request = ExecutionRequest(
            request_id=f"{prefix}-{i}", task=task, files={}, commands=[ARGV], grade=False
        )
        start = time.perf_counter()
        (result,) = client.run([request], timeout=300)
        took = time.perf_counter() - start
        if result.status != Status.SUCCEEDED:
            raise RuntimeError(f"{request.request_id}: {result.status}: {result.error}")
        if i:
            latency.append(took)
    return {"executions": n, "latency": ms(latency)}


def restores(client: Client, task: Task, n: int) -> dict[str, Any]:
    """3: a call after the worker freed the session's slot restores its checkpoint."""
    rows: list[dict[str, Any]] = []
    with client.session(task, ttl_s=TTL_S, idle_release_s=1) as s:
        for _ in range(n):
            step(s)  # the workspace is held
            time.sleep(IDLE_SLEEP_S)
            result, latency = step(s)
            rows.append(
                {
                    "restored_ms": None
                    if result.restored_s is None
                    else round(result.restored_s * 1000, 1),
                    "latency_ms": round(latency * 1000, 1),
                    "wall_ms": round(result.commands[0].wall_s * 1000, 1),
                }
            )
    restored = [r["restored_ms"] for r in rows if r["restored_ms"] is not None]
    return {
        "runs": rows,
        "restored_p50_ms": round(pct(restored, 0.5), 1) if restored else None,
        "latency_p50_ms": round(pct([r["latency_ms"] for r in rows], 0.5), 1),
    }


def failover(client: Client, task: Task) -> dict[str, Any]:
    """4: SIGKILL every worker between two calls; time the second until it returns."""
    twin = client.aio._twin
    assert twin is not None and twin.pool is not None
    with client.session(task, ttl_s=TTL_S) as s:
        step(s)
        before = s.worker
        killed = twin.pool.kill()
        result, latency = step(s)
        after_latency = step(s)[1]  # the next call, on the new worker
        return {
            "killed_pids": len(killed),
            "failover_ms": round(latency * 1000, 1),
            "failover_s_setting": FAILOVER_S,
            "restored_ms": None
            if result.restored_s is None
            else round(result.restored_s * 1000, 1),
            "failovers": s.failovers,
            "worker_before": before,
            "worker_after": result.worker,
            "next_call_ms": round(after_latency * 1000, 1),
        }


def per_worker(client: Client, task: Task, k: int) -> dict[str, Any]:
    """5: K sessions at once, each 5 calls with think time; who served them."""
    opened = threading.Barrier(k)
    ends: list[float] = []
    starts: list[float] = []
    lock = threading.Lock()

    def one(_: int) -> list[str]:
        workers: list[str] = []
        try:
            s = client.session(task, ttl_s=TTL_S)
        except BaseException:
            opened.abort()  # the others stop waiting
            raise
        with s:
            opened.wait(timeout=300)
            with lock:
                starts.append(time.perf_counter())
            for _ in range(CALLS_PER_SESSION):
                result, _latency = step(s)
                workers.append(result.worker or "?")
                time.sleep(THINK_S)
            with lock:
                ends.append(time.perf_counter())
        return workers

    start = time.perf_counter()
    with ThreadPoolExecutor(k) as pool:
        served = list(pool.map(one, range(k)))
    total = time.perf_counter() - start
    by_session = Counter(ws[0] for ws in served)
    moved = sum(len(set(ws)) > 1 for ws in served)
    calls = k * CALLS_PER_SESSION
    call_phase = max(ends) - max(starts)
    return {
        "sessions": k,
        "calls": calls,
        "workers_used": len(by_session),
        "sessions_by_worker": dict(sorted(by_session.items())),
        "sessions_per_worker": round(k / len(by_session), 2),
        "sessions_that_moved": moved,
        "calls_per_s": round(calls / call_phase, 2),
        "calls_per_s_with_open_close": round(calls / total, 2),
        "think_s": THINK_S,
    }


def table(report: dict[str, Any]) -> None:
    pc, ex = report["per_call"], report["one_execution"]
    print(f"{'per call (python -c pass)':<34}{'p50 ms':>10}{'p95 ms':>10}")
    rows = [
        (f"session call latency (n={pc['calls']})", pc["session_latency"]),
        ("session call overhead", pc["session_overhead"]),
        ("bare bwrap exec (caller)", pc["bare_exec"]),
        ("bare bwrap exec overhead", pc["bare_exec_overhead"]),
        (f"one execution (n={ex['executions']})", ex["latency"]),
    ]
    for name, figures in rows:
        print(f"{name:<34}{figures['p50_ms']:>10.1f}{figures['p95_ms']:>10.1f}")
    ratios = report["ratios"]
    print(f"session overhead / bare exec (p50): {ratios['overhead_over_bare_exec']}")
    print(f"session latency / one execution (p50): {ratios['latency_over_one_execution']}")
    rs = report["restore"]
    for i, row in enumerate(rs["runs"], 1):
        print(
            f"restore {i}: restored_s {row['restored_ms']} ms, call {row['latency_ms']} ms "
            f"(command {row['wall_ms']} ms)"
        )
    fo = report["failover"]
    print(
        f"failover: {fo['failover_ms']} ms (FAILOVER_S {fo['failover_s_setting']}), "
        f"failovers {fo['failovers']}, restored_s {fo['restored_ms']}, "
        f"{fo['worker_before']} -> {fo['worker_after']}, next call {fo['next_call_ms']} ms"
    )
    pw = report["per_worker"]
    print(
        f"{pw['sessions']} sessions: {pw['workers_used']} worker(s) {pw['sessions_by_worker']}, "
        f"{pw['sessions_per_worker']} per worker, {pw['calls_per_s']} calls/s "
        f"({pw['calls_per_s_with_open_close']} with open and close)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="timed session calls (and bare execs)")
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions (part 5)")
    parser.add_argument("--executions", type=int, default=10, help="timed one-step executions")
    parser.add_argument("--restores", type=int, default=3, help="idle releases and restores")
    args = parser.parse_args()
    task = Task.model_validate(ADD_TASK)
    try:
        runner = Runner()
        with Client.local(workers=WORKERS) as client:
            report: dict[str, Any] = {"workers": WORKERS}
            report["per_call"] = per_call(client, task, runner, args.n)
            report["one_execution"] = one_execution(client, task, args.executions)
            report["restore"] = restores(client, task, args.restores)
            report["per_worker"] = per_worker(client, task, args.sessions)
            report["failover"] = failover(client, task)  # last: it kills the pool
    except Exception:
        traceback.print_exc()
        return 1
    pc, ex = report["per_call"], report["one_execution"]
    report["ratios"] = {
        "overhead_over_bare_exec": round(
            pc["session_overhead"]["p50_ms"] / pc["bare_exec"]["p50_ms"], 3
        ),
        "latency_over_bare_exec": round(
            pc["session_latency"]["p50_ms"] / pc["bare_exec"]["p50_ms"], 3
        ),
        "latency_over_one_execution": round(
            pc["session_latency"]["p50_ms"] / ex["latency"]["p50_ms"], 3
        ),
    }
    table(report)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
