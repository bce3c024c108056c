"""End-to-end throughput of the local twin against a bare loop, in one run.

1. 100 trivial pytest samples through the whole pipeline (SDK -> SQS -> dispatcher -> Rollout
   -> bwrap worker -> Score -> Record -> SDK) versus the same 100 pytest invocations run by a
   bare loop of subprocesses (2 at a time, as the twin has 2 workers).
2. p50 per-execution latency and its breakdown from the execution histories: queue (submit to
   execution start), Step Functions (Prepare + Score + Record states), sandbox (Execute).
3. Peak RSS of the twin process and of its function processes.
Run: `.venv/bin/python benchmarks/pipeline_throughput.py -n 100`.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trialbox import constants as c
from trialbox.client import Client
from trialbox.models import ExecutionRequest

TESTS = "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
SOLUTION = "def add(a, b):\n    return a + b\n"
TASK = {
    "task_id": "bench",
    "hidden_tests": {"tests/test_add.py": TESTS},
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}


def bare(n: int, python: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "solution.py").write_text(SOLUTION)
        (work / "tests").mkdir()
        (work / "tests" / "test_add.py").write_text(TESTS)
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: subprocess.run(argv, cwd=work, capture_output=True), range(n)))
        return time.perf_counter() - start


def breakdown(client: Client, ids: list[str], submitted: float) -> dict[str, float]:
    assert client._twin is not None
    sfn = client._twin.client("stepfunctions")
    arn = client._twin.output(c.OUTPUT_ROLLOUT_ARN).replace(":stateMachine:", ":execution:")
    parts: dict[str, list[float]] = {"queue": [], "step_functions": [], "sandbox": []}
    for rid in ids:
        execution = sfn.describe_execution(executionArn=f"{arn}:{rid}")
        events = sfn.get_execution_history(executionArn=f"{arn}:{rid}")["events"]
        entered = {e["stateEnteredEventDetails"]["name"]: e["timestamp"].timestamp()
                   for e in events if "stateEnteredEventDetails" in e}  # fmt: skip
        exited = {e["stateExitedEventDetails"]["name"]: e["timestamp"].timestamp()
                  for e in events if "stateExitedEventDetails" in e}  # fmt: skip
        parts["queue"].append(execution["startDate"].timestamp() - submitted)
        parts["sandbox"].append(exited["Execute"] - entered["Execute"])
        steps = sum(exited[s] - entered[s] for s in ("Prepare", "Score", "Record") if s in exited)
        parts["step_functions"].append(steps)
    return {k: round(statistics.median(v), 3) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=100)
    args = parser.parse_args()
    with Client.local(workers=2) as client:
        python = str(client._twin._runner.runtime.python)  # type: ignore[union-attr]
        warm = [ExecutionRequest.model_validate({"request_id": "warm", "task": TASK,
                                                 "files": {"solution.py": SOLUTION}})]  # fmt: skip
        client.run(warm)
        requests = [
            ExecutionRequest.model_validate(
                {"request_id": f"b-{i}", "task": TASK, "files": {"solution.py": SOLUTION}}
            )
            for i in range(args.n)
        ]
        submitted = time.time()
        start = time.perf_counter()
        results = client.run(requests, timeout=1800)
        twin_s = time.perf_counter() - start
        assert all(r.reward == 1.0 for r in results)
        parts = breakdown(client, [r.request_id for r in requests], submitted)
        bare_s = bare(args.n, python)
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    report = {
        "samples": args.n,
        "twin_s": round(twin_s, 2),
        "twin_per_s": round(args.n / twin_s, 2),
        "bare_s": round(bare_s, 2),
        "bare_per_s": round(args.n / bare_s, 2),
        "twin_over_bare_throughput": round((args.n / twin_s) / (args.n / bare_s), 3),
        "p50_breakdown_s": parts,
        "peak_rss_twin_mb": round(self_mb, 1),
        "peak_rss_largest_child_mb": round(children_mb, 1),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
