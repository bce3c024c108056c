"""What a local twin costs before it runs anything: its start (wall, and the whole machine's
CPU from /proc/stat during it), and its idle CPU a second once up, beside the machine's own
with no twin (measured first, in the same run). The suite starts about 45 twins (tests,
`trialbox run --local`, the examples), so this is paid that often.

Run on a quiet machine: `.venv/bin/python benchmarks/twin_start.py -n 5`. Prints JSON: each
start's figures and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from orchestration_cpu import machine_busy_s

from trialbox.local.twin import LocalTwin

IDLE_S = 10.0
SETTLE_S = 10.0


def one(workers: int) -> dict[str, float]:
    busy, start = machine_busy_s(), time.perf_counter()
    with LocalTwin(workers=workers):
        up_s, up_cpu_s = time.perf_counter() - start, machine_busy_s() - busy
        time.sleep(SETTLE_S)  # the workers' own start, and their warm processes'
        idle_busy = machine_busy_s()
        time.sleep(IDLE_S)
        idle = (machine_busy_s() - idle_busy) / IDLE_S
    return {
        "start_wall_s": round(up_s, 2),
        "start_cpu_s": round(up_cpu_s, 2),
        "idle_cpu_ms_per_s": round(1000 * idle, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=5, help="twins started, one after another")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    busy = machine_busy_s()
    time.sleep(IDLE_S)
    baseline = round(1000 * (machine_busy_s() - busy) / IDLE_S, 1)  # the machine, no twin
    runs = [one(args.workers) for _ in range(args.n)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    report = {"workers": args.workers, "machine_idle_cpu_ms_per_s": baseline, "runs": runs}
    print(json.dumps(report | {"median": medians}, indent=2))


if __name__ == "__main__":
    main()
