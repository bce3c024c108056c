"""End-to-end throughput of the local twin against a bare loop, in one run.

1. `trialbox run --local` on N trivial pytest samples (SDK -> SQS -> dispatcher -> Rollout ->
   bwrap worker -> Score -> Record -> SDK), as a user runs it: the command's wall time, twin
   start included. The same N samples through an in-process twin give the steady rate, without
   the start.
2. The baseline: the same N pytest invocations in subprocesses, 2 at a time (the twin's
   workers), with the same interpreter.
3. p50 per-execution latency and its breakdown, from the execution histories and the results'
   timings: queue (submit to execution start), Prepare, the wait for a free worker, the sandbox
   run, the callback, Score, Record, and the SDK's poll.
4. Peak RSS of the benchmark process (the in-process twin) and of its largest child.
Run: `make bench`, or `.venv/bin/python benchmarks/pipeline_throughput.py -n 100`.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionRequest, ExecutionResult
from trialbox.sdk import Client

TESTS = "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
SOLUTION = "def add(a, b):\n    return a + b\n"
TASK = {
    "task_id": "bench",
    "hidden_tests": {"tests/test_add.py": TESTS},
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
WORKERS = 2


def bare(n: int, python: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "solution.py").write_text(SOLUTION)
        (work / "tests").mkdir()
        (work / "tests" / "test_add.py").write_text(TESTS)
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
        start = time.perf_counter()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda _: subprocess.run(argv, cwd=work, capture_output=True), range(n)))
        return time.perf_counter() - start


def cli(n: int) -> float:
    """`trialbox run --local`, wall time of the whole command."""
    with tempfile.TemporaryDirectory() as tmp:
        tasks, samples, out = Path(tmp, "tasks.jsonl"), Path(tmp, "samples.jsonl"), Path(tmp, "o")
        tasks.write_text(json.dumps(TASK) + "\n")
        line = {"task_id": "bench", "files": {"solution.py": SOLUTION}}
        samples.write_text("".join(json.dumps(line | {"sample_id": f"s{i}"}) + "\n"
                                   for i in range(n)))  # fmt: skip
        argv = [sys.executable, "-m", "trialbox", "run", "--local", "--tasks", str(tasks)]
        argv += ["--samples", str(samples), "--out", str(out)]
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        wall = time.perf_counter() - start
        rows = [json.loads(row) for row in out.read_text().splitlines()]
        assert len(rows) == n and all(r["reward"] == 1.0 for r in rows), rows[:3]
        return wall


@dataclass
class Steady:
    wall_s: float
    submitted: dict[str, float]  # epoch s, by request id
    seen: dict[str, float]  # epoch s the SDK saw the result
    results: dict[str, ExecutionResult]


def steady(client: Client, n: int) -> Steady:
    """N samples through a started twin, through the SDK's own admission control (what
    `trialbox run` uses)."""
    body = {"task": TASK, "files": {"solution.py": SOLUTION}}
    prefix = f"b{n}"
    requests = [
        ExecutionRequest.model_validate(body | {"request_id": f"{prefix}-{i}"}) for i in range(n)
    ]
    seen: dict[str, float] = {}
    results: dict[str, ExecutionResult] = {}
    start = time.perf_counter()
    handles = client.submit(requests)
    for handle in client.as_completed(handles, timeout=1800):
        seen[handle.request_id], results[handle.request_id] = time.time(), handle.result()
    wall = time.perf_counter() - start
    assert len(results) == n and all(r.reward == 1.0 for r in results.values())
    # Epoch seconds each request was sent: the handles keep monotonic time.
    offset = time.time() - time.monotonic()
    submitted = {h.request_id: (h.sent_at or 0) + offset for h in handles}
    return Steady(wall, submitted, seen, results)


def breakdown(twin: LocalTwin, run: Steady) -> dict[str, float]:
    """The p50 of each step of the samples that ran alone (a Rollout execution each; a
    batched sample's steps are not states of its own), and how many ran in batches."""
    sfn = twin.client("stepfunctions")
    arn = twin.output(c.OUTPUT_ROLLOUT_ARN).replace(":stateMachine:", ":execution:")
    parts: dict[str, list[float]] = {}
    batched = 0
    for rid, at in run.submitted.items():
        result = run.results[rid]
        try:
            events = sfn.get_execution_history(executionArn=f"{arn}:{rid}")["events"]
        except sfn.exceptions.ExecutionDoesNotExist:
            batched += 1
            continue
        entered = {e["stateEnteredEventDetails"]["name"]: e["timestamp"].timestamp()
                   for e in events if "stateEnteredEventDetails" in e}  # fmt: skip
        exited = {e["stateExitedEventDetails"]["name"]: e["timestamp"].timestamp()
                  for e in events if "stateExitedEventDetails" in e}  # fmt: skip
        started = events[0]["timestamp"].timestamp()
        t = result.timings
        assert t.started_at is not None and t.finished_at is not None
        spans = {
            "queue (submit -> execution start)": started - at,
            "prepare": exited["Prepare"] - entered["Prepare"],
            "wait for a worker": t.started_at - entered["Execute"],
            "sandbox run": t.finished_at - t.started_at,
            "callback -> Execute done": exited["Execute"] - t.finished_at,
            "score and record": exited["Record"] - entered["Record"],
            "sdk poll (record -> seen)": run.seen[rid] - exited["Record"],
            "total": run.seen[rid] - at,
        }
        for name, span in spans.items():
            parts.setdefault(name, []).append(span)
    return {k: round(statistics.median(v), 3) for k, v in parts.items()} | {"batched": batched}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=100)
    args = parser.parse_args()
    cli_s = cli(args.n)
    with Client.local(workers=WORKERS) as client:
        twin = client.aio._twin
        assert twin is not None
        python = str(twin._runner.runtime.python)
        steady(client, 4)  # warm: first imports in the function processes
        run = steady(client, args.n)
        parts = breakdown(twin, run)
        bare_s = bare(args.n, python)
    report = {
        "samples": args.n,
        "trialbox_run_local_s": round(cli_s, 2),
        "trialbox_run_local_per_s": round(args.n / cli_s, 2),
        "twin_steady_s": round(run.wall_s, 2),
        "twin_steady_per_s": round(args.n / run.wall_s, 2),
        "bare_s": round(bare_s, 2),
        "bare_per_s": round(args.n / bare_s, 2),
        "run_over_bare": round(bare_s / cli_s, 3),
        "steady_over_bare": round(bare_s / run.wall_s, 3),
        "p50_breakdown_s": parts,
        "peak_rss_twin_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_largest_child_mb": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
        ),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
