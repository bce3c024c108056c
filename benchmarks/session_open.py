"""Sessions opened at once on the local twin: how long each open takes, and the queues made.

One twin with a slot for every session (`--workers` workers), its requests logged. First a
baseline, same run: `--alone` sessions opened one at a time (each open's latency, the
caller's wall time). Then `--sessions` opened at once from as many threads of one client
(`Client.session`), each timed from its call to its return; once all are open, `--calls` of
them make one call (the first makes the workspace: its CPU is the machine's, not the
queues'), and all close. Printed: p50, p95 and max of both, their ratio, and the SQS CreateQueue and
DeleteQueue calls of the burst per session, read from the twin's request log (issue 24: 0
per session, an open p95 of at most 2 s for 256). Figures only, no assert. Run:
`.venv/bin/python benchmarks/session_open.py --sessions 256`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trialbox.local.requestlog import ENV_REQUEST_LOG, calls
from trialbox.models import Task
from trialbox.sandbox.config import ENV_PREFIX
from trialbox.sdk import Client

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks.jsonl"
TASK = Task.model_validate(json.loads(TASKS.read_text().splitlines()[0]))


def quantiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, ordered[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--alone", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=16, help="sessions that then make a call")
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="trialbox-sessions-")) / "requests.jsonl"
    os.environ[ENV_REQUEST_LOG] = str(log)
    os.environ[f"{ENV_PREFIX}SLOTS"] = str(args.sessions + 2 * args.workers)
    with Client.local(workers=args.workers) as client:
        alone = []
        for _ in range(args.alone):
            started = time.perf_counter()
            with client.session(TASK, ttl_s=600):
                alone.append(time.perf_counter() - started)
        before = len(calls(log))
        opened: list[float] = []

        opened_at: list[tuple[float, int]] = []  # when the last open returned; log lines then
        all_open = threading.Barrier(
            args.sessions, action=lambda: opened_at.append((time.perf_counter(), len(calls(log))))
        )
        burst_at = time.perf_counter()

        def episode(n: int) -> None:
            started = time.perf_counter()
            with client.session(TASK, ttl_s=600) as s:
                opened.append(time.perf_counter() - started)
                all_open.wait()  # the calls start once every session is open
                if n < args.calls:  # a first call makes its workspace: CPU, not queues
                    s.exec(["true"])

        with ThreadPoolExecutor(args.sessions) as pool:
            list(pool.map(episode, range(args.sessions)))
        made = Counter(c.operation for c in calls(log)[before:])
    a50, a95, amax = quantiles(alone)
    b50, b95, bmax = quantiles(opened)
    print(f"session opens on the twin, {args.workers} workers (load {os.getloadavg()[0]:.1f})")
    print(
        f"alone ({args.alone}, one at a time): p50 {a50:.2f} s  p95 {a95:.2f} s  max {amax:.2f} s"
    )
    print(f"{args.sessions} at once: p50 {b50:.2f} s  p95 {b95:.2f} s  max {bmax:.2f} s")
    print(f"p95 at once / p95 alone: {b95 / a95:.1f}")
    (open_end, open_lines) = opened_at[0]
    opening = open_lines - before
    print(
        f"the opens: {opening / args.sessions:.1f} calls a session; the twin's AWS side served "
        f"{opening / (open_end - burst_at):,.0f} calls/s over them (one moto process)"
    )
    for operation in ("CreateQueue", "DeleteQueue", "TagQueue"):
        print(f"{operation}: {made[operation]} ({made[operation] / args.sessions:.3f} a session)")
    print(f"all calls of the burst (open, {args.calls} calls, close): "
          f"{sum(made.values()) / args.sessions:.1f} a session; by operation: "
          + ", ".join(f"{op} {n}" for op, n in made.most_common()))  # fmt: skip


if __name__ == "__main__":
    main()
