"""The twin's orchestration CPU per sample: all the machine's CPU, less the sandboxes' own.

A twin with 2 workers runs N small pytest samples, sent two ways:
- `single`: each its own `Client.submit` (its own Rollout execution: Prepare, Execute,
  Record), all in flight at once;
- `batch`: one `Client.submit` of all N (the dispatcher's batches: one execution for many).
Counted over each run:
- the machine: every CPU's non-idle time in /proc/stat (user, nice, system, irq, softirq,
  steal), so nothing escapes, not a process that came and went;
- the sandboxes: each result's commands' `cpu_s` (the sandbox cgroup's cpuacct on bwrap);
- orchestration = machine - sandboxes, per sample: moto, the Lambda handlers' processes, the
  workers' runner outside the sandbox, the SDK's polling, and the benchmark's own loop;
- a breakdown by process kind, from /proc/<pid>/stat of the twin's processes and the CPU of the
  children they reaped (utime + stime + cutime + cstime, before and after), so the largest
  share is visible. What is left is this process (the SDK and the in-process twin's threads)
  and whatever else ran on the machine: run it on a quiet machine;
- with `--calls`, the AWS calls per sample by operation, from the twin's request log (which
  costs some CPU of its own: the CPU figures are for a run without it).
Target (issue 25): orchestration <= 25 ms per sample, for single submissions and batches.
Run: `make bench`, or `.venv/bin/python benchmarks/orchestration_cpu.py -n 100`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pipeline_throughput import SOLUTION, TASK, WORKERS  # the same small pytest sample

from trialbox.local.requestlog import ENV_REQUEST_LOG, calls
from trialbox.models import ExecutionRequest, ExecutionResult
from trialbox.sdk import Client

TICK = os.sysconf("SC_CLK_TCK")
TARGET_MS = 25.0


def machine_busy_s() -> float:
    """Every CPU's non-idle time since boot (/proc/stat's first line, less idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def _kind(cmdline: str) -> str:
    for marker, kind in (
        ("trialbox.local.services", "moto (services)"),
        ("trialbox.local.forks", "lambda handlers (and their zygote)"),
        ("trialbox.worker", "workers (runner, outside the sandbox)"),
        ("bwrap", "sandbox start (bwrap)"),
    ):
        if marker in cmdline:
            return kind
    return "other: " + cmdline[:40]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def by_kind() -> defaultdict[str, float]:
    """CPU seconds of this process's descendants, with what each reaped, by kind."""
    spent: defaultdict[str, float] = defaultdict(float)
    for pid in _descendants(os.getpid()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        utime, stime, cutime, cstime = (int(x) for x in stat[11:15])
        spent[_kind(cmdline)] += (utime + stime + cutime + cstime) / TICK
    return spent


def requests(prefix: str, n: int) -> list[ExecutionRequest]:
    body = {"task": TASK, "files": {"solution.py": SOLUTION}}
    return [
        ExecutionRequest.model_validate(body | {"request_id": f"{prefix}-{i}"}) for i in range(n)
    ]


def run(client: Client, mode: str, n: int, log: Path | None) -> dict[str, object]:
    batch = requests(f"{mode}-{time.time_ns()}", n)
    first_call = len(calls(log)) if log else 0
    kinds, busy, own = by_kind(), machine_busy_s(), time.process_time()
    start = time.perf_counter()
    if mode == "single":
        handles = [handle for request in batch for handle in client.submit([request])]
    else:
        handles = client.submit(batch)
    results: list[ExecutionResult] = [
        h.result() for h in client.as_completed(handles, timeout=1800)
    ]
    wall = time.perf_counter() - start
    machine = machine_busy_s() - busy
    after = by_kind()
    spent = {kind: after[kind] - kinds[kind] for kind in after}
    spent["this process (SDK, in-process twin)"] = time.process_time() - own
    assert len(results) == n and all(r.reward == 1.0 for r in results), results[:2]
    sandboxes = sum(cmd.cpu_s for r in results for cmd in r.commands)
    orchestration = machine - sandboxes
    made = Counter(f"{c.service}:{c.operation}" for c in calls(log)[first_call:]) if log else {}
    return {
        "mode": mode,
        "samples": n,
        "wall_s": round(wall, 2),
        "machine_cpu_ms_per_sample": round(1000 * machine / n, 1),
        "sandbox_cpu_ms_per_sample": round(1000 * sandboxes / n, 1),
        "orchestration_cpu_ms_per_sample": round(1000 * orchestration / n, 1),
        "target_ms": TARGET_MS,
        "calls_per_sample": round(sum(made.values()) / n, 2),
        "most_calls_per_sample": {k: round(v / n, 2) for k, v in Counter(made).most_common(12)},
        "by_process_ms_per_sample": {
            k: round(1000 * v / n, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=100)
    parser.add_argument("--modes", nargs="+", default=["single", "batch"])
    parser.add_argument("--calls", action="store_true", help="count AWS calls (request log)")
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="trialbox-orch-")) / "requests.jsonl" if args.calls else None
    if log:
        os.environ[ENV_REQUEST_LOG] = str(log)
    with Client.local(workers=WORKERS) as client:
        run(client, "batch", 4, log)  # warm: the function processes' first imports
        reports = [run(client, mode, args.n, log) for mode in args.modes]
    print(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
