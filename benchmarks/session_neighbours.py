"""A victim session's calls beside hostile neighbours on one worker (issue 22).

One twin worker (`Client.local(workers=1)`) hosts a victim session and, in phase 2, four
hostile ones. The victim's call is `python -c pass`; its latency is the caller's wall time.
Each neighbour first writes `--mib` MiB of text-like bytes (0: none, the control: neighbours
as busy, with nothing to checkpoint), then loops (`--think` s apart) on a call that only
`touch`es it: every call changes the workspace's metadata, so the worker must look again, yet
stores nothing new (no quota stops it). With `--fresh`, the neighbours write new random bytes
each call instead (the storage quota then stops them). Phase 1: the victim alone, N calls.
Phase 2: the same N calls with the neighbours running. Reports p50/p95 of both, their ratio
(the issue's bound: p50 within 1.25x), the neighbours' calls, and the worker's peak RSS.
Figures only, no asserts. Run: `.venv/bin/python benchmarks/session_neighbours.py -n 30`.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from trialbox.models import Status, Task
from trialbox.sdk import Client
from trialbox.sdk.sync import Session

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks.jsonl"
TASK = Task.model_validate(json.loads(TASKS.read_text().splitlines()[0]))
VICTIM = ["python", "-c", "pass"]
NEIGHBOURS = 4


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def victim_calls(s: Session, n: int) -> list[float]:
    took = []
    for _ in range(n):
        start = time.perf_counter()
        result = s.step(commands=[VICTIM])
        took.append(time.perf_counter() - start)
        if result.status != Status.SUCCEEDED or result.error is not None:
            raise RuntimeError(f"victim call: {result.status} {result.error}")
    return took


def neighbour(
    client: Client, mib: int, fresh: bool, think_s: float, stop: threading.Event, out: list[int]
) -> None:
    fill = (
        "python -c \"import random; w=[bytes(random.choices(b'abcdefghij', k=6)) for _ in "
        f"range(5000)]; open('big','wb').write(b' '.join(random.choices(w, k={mib} * 150000)))\""
    )
    again = f"head -c {mib * 1000000} /dev/urandom > big" if fresh else "touch big"
    with client.session(TASK, ttl_s=900, limits={"disk_mb": max(64, 2 * mib)}) as s:
        if mib:
            s.step(commands=[["sh", "-c", fill]], timeout_s=60)
        calls = 0
        while not stop.wait(think_s):
            s.step(commands=[["sh", "-c", again]], timeout_s=60)
            calls += 1
        out.append(calls)


def worker_rss_mib() -> float:
    """The RSS of this process's descendants that run `-m trialbox.worker`."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parents[int(entry.name)] = int(fields["PPid"])
        if b"trialbox.worker" in cmdline and "VmRSS" in fields:
            rss[int(entry.name)] = int(fields["VmRSS"].split()[0])

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    return sum(kib for pid, kib in rss.items() if mine(pid)) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--mib", type=int, default=24)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--think", type=float, default=0.0, help="a neighbour's pause (s)")
    args = parser.parse_args()
    report: dict[str, Any] = {"mib": args.mib, "fresh": args.fresh, "think_s": args.think}
    with Client.local(workers=1) as client, client.session(TASK, ttl_s=900) as victim:
        victim_calls(victim, 3)
        alone = victim_calls(victim, args.n)
        report["rss_alone_mib"] = round(worker_rss_mib(), 1)
        stop, counts = threading.Event(), list[int]()
        threads = [
            threading.Thread(
                target=neighbour, args=(client, args.mib, args.fresh, args.think, stop, counts)
            )
            for _ in range(NEIGHBOURS)
        ]
        for thread in threads:
            thread.start()
        time.sleep(15)  # the neighbours open and fill
        peak = 0.0
        crowded = []
        for _ in range(args.n):
            crowded += victim_calls(victim, 1)
            peak = max(peak, worker_rss_mib())
        stop.set()
        for thread in threads:
            thread.join()
    report |= {
        "alone_p50_ms": round(pct(alone, 0.5) * 1000, 1),
        "alone_p95_ms": round(pct(alone, 0.95) * 1000, 1),
        "crowded_p50_ms": round(pct(crowded, 0.5) * 1000, 1),
        "crowded_p95_ms": round(pct(crowded, 0.95) * 1000, 1),
        "p50_ratio": round(pct(crowded, 0.5) / pct(alone, 0.5), 2),
        "neighbour_calls": counts,
        "rss_crowded_peak_mib": round(peak, 1),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
