"""The issue's burst, as a user runs it: N samples of about 3 s each sent at once
(`trialbox run --local --concurrency N`) to a twin of 2 workers with its default heartbeat
(60 s). Before admission (trialbox.pipeline.admission) the jobs that waited for a worker longer
than the heartbeat were retried as lost sandboxes and ended `sandbox_error`, masked (51 of
160). Reports each status's count, the results' attempts, and the wall time against the ideal
(N x the job's own time / 2 workers).
Run: `.venv/bin/python benchmarks/burst.py -n 160`.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
TASK = {
    "task_id": "burst",
    "hidden_tests": {"tests/test_add.py": TEST},
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
SOLUTION = "def add(a, b):\n    return a + b\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=160)
    parser.add_argument("--sleep-s", type=float, default=2.5, help="each sample's command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
        rows = [
            {"task_id": "burst", "sample_id": f"s{i}", "files": {"solution.py": SOLUTION},
             "commands": [["sleep", str(args.sleep_s)]]}
            for i in range(args.n)
        ]  # fmt: skip
        (tmp / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp / "out.jsonl"
        command = [sys.executable, "-m", "trialbox", "run", "--local",
                   "--tasks", str(tmp / "tasks.jsonl"), "--samples", str(tmp / "samples.jsonl"),
                   "--out", str(out), "--concurrency", str(args.n)]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        took = time.monotonic() - started
        results = [json.loads(line) for line in out.read_text().splitlines()]
    statuses = collections.Counter(r["status"] for r in results)
    attempts = collections.Counter(r.get("attempts", 1) for r in results)
    print(f"samples            {args.n} (exit {done.returncode})")
    print(f"statuses           {dict(statuses)}")
    print(f"attempts           {dict(sorted(attempts.items()))}")
    print(f"wall               {took:.0f} s (twin start included)")
    print(f"ideal              {args.n * args.sleep_s / 2:.0f} s of sleeps alone on 2 workers")


if __name__ == "__main__":
    main()
