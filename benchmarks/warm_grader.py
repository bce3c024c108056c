"""The runner against a bare pytest loop on distinct samples, paired and interleaved.

Samples: for each HumanEval task (the first -n), one of each kind: `pass` (the canonical
solution), `fail` (it returns None), `error` (it raises at import), `timeout` (it never
returns; the task's limit is TIMEOUT_S), `memory` (it holds 150 MiB, then passes), `numpy`
(it imports numpy, then passes); and `io_match` samples of a stdin/stdout task (right and
wrong answers). No cache: every sample's files differ from the others'.

Each round grades every sample twice, with the same parallelism (the machine's cores): through
the runner (its default isolation, the backend named), and through a bare pytest loop (a
subprocess per sample in a temporary directory, no sandbox, the same timeout; io_match samples
run their program once per case and compare). Which way goes first alternates by round. The
figures: samples/s each way, their ratio per round (median and spread over the rounds), the
runner's CPU-seconds per sample, all-in (the machine's CPU, /proc/stat, over its half of the
round), and the CPU its graders used (the grading commands' cpu_s). `--compare-cold` adds the
same runner with warm graders off, in the same rounds.

Run: `.venv/bin/python benchmarks/warm_grader.py --backend rlimit -n 40 --rounds 5`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialbox.models import Sample, Task
from trialbox.qc import humaneval
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TIMEOUT_S = 3
KINDS = ("pass", "fail", "error", "timeout", "memory", "numpy")
IO_INPUTS = ["1 2\n", "3 4\n", "10 20\n", "-5 5\n"]
IO_OUTPUTS = ["3\n", "7\n", "30\n", "0\n"]
IO_TASK = Task.model_validate(
    {
        "task_id": "io-sum",
        "workspace": {"solution.py": ""},
        "grading": {
            "scorer": "io_match",
            "io": {"inputs": IO_INPUTS, "outputs": IO_OUTPUTS},
        },
        "limits": {"timeout_s": TIMEOUT_S},
    }
)


@dataclass(frozen=True)
class Item:
    task: Task
    kind: str
    code: str  # solution.py


def _variant(kind: str, canonical: str, n: int) -> str:
    tag = f"# sample {kind} {n}\n"
    if kind == "pass":
        return tag + canonical
    if kind == "fail":
        return tag + canonical + "\n\ndef _wrong(*a, **k):\n    return None\n" + _rebind(canonical)
    if kind == "error":
        return tag + "raise RuntimeError('broken at import')\n" + canonical
    if kind == "timeout":
        return tag + "while True:\n    pass\n" + canonical
    if kind == "memory":
        return (
            tag
            + "HELD = bytearray(150 * 2**20)\nHELD[::4096] = b'x' * len(HELD[::4096])\n"
            + canonical
        )
    return tag + "import numpy\n" + canonical  # numpy


def _rebind(canonical: str) -> str:
    """Every top-level function rebound to one that answers None."""
    names = [
        line[4:].split("(", 1)[0] for line in canonical.splitlines() if line.startswith("def ")
    ]
    return "".join(f"{name} = _wrong\n" for name in names)


def items(n: int) -> list[Item]:
    found = []
    for index, raw in enumerate(humaneval.tasks()[:n]):
        task = Task.model_validate(raw)
        task = task.model_copy(
            update={"limits": task.limits.model_copy(update={"timeout_s": TIMEOUT_S})}
        )
        assert task.reference is not None
        canonical = str(task.reference["solution.py"])
        for kind in KINDS:
            found.append(Item(task, kind, _variant(kind, canonical, index)))
    for index in range(max(2, n // 4)):
        extra = "+ 1" if index % 2 else ""
        code = f"# io {index}\na, b = map(int, input().split())\nprint(a + b {extra})\n"
        found.append(Item(IO_TASK, "io_match", code))
    return found


def via_runner(runner: Runner) -> Callable[[Item], tuple[str, float, float]]:
    def grade(item: Item) -> tuple[str, float, float]:
        sample = Sample(
            task_id=item.task.task_id, sample_id=item.kind, files={"solution.py": item.code}
        )
        report = runner.run(item.task, sample)
        result = score(item.task.grading, report)
        graders = sum(c.cpu_s for c in report.commands if c.phase == "grading")
        return result.status.value, result.reward or 0.0, graders

    return grade


def via_bare_pytest(python: str) -> Callable[[Item], tuple[str, float, float]]:
    def grade(item: Item) -> tuple[str, float, float]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "solution.py").write_text(item.code)
            if item.task.grading.io is not None:
                return _io_bare(python, root, item)
            (root / "tests").mkdir()
            (root / "tests" / "test_humaneval.py").write_text(
                str(item.task.hidden_tests[humaneval.TEST_FILE])
            )
            try:
                done = subprocess.run(
                    [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                    cwd=root,
                    capture_output=True,
                    timeout=TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                return "timeout", 0.0, 0.0
        return "succeeded", float(done.returncode == 0), 0.0

    return grade


def _io_bare(python: str, root: Path, item: Item) -> tuple[str, float, float]:
    right = 0
    for given, wanted in zip(IO_INPUTS, IO_OUTPUTS, strict=True):
        done = subprocess.run(
            [python, "solution.py"],
            cwd=root,
            input=given.encode(),
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        right += done.stdout.decode() == wanted
    return "succeeded", right / len(IO_INPUTS), 0.0


def _cpu_s() -> float:
    """The machine's busy CPU-seconds so far (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def timed(
    way: Callable[[Item], tuple[str, float, float]], chosen: list[Item], workers: int
) -> dict[str, Any]:
    walls: list[float] = [0.0] * len(chosen)

    def one(index: int) -> tuple[str, float, float]:
        start = time.perf_counter()
        try:
            return way(chosen[index])
        finally:
            walls[index] = time.perf_counter() - start

    cpu, start = _cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, range(len(chosen))))
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu
    return {
        "samples_per_s": len(chosen) / wall,
        "cpu_s_per_sample": cpu / len(chosen),
        "grader_cpu_s_per_sample": sum(r[2] for r in results) / len(chosen),
        "rewards": [r[1] for r in results],
        "walls": walls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="HumanEval tasks (the first n)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["bwrap", "rlimit"], default=None)
    parser.add_argument("--compare-cold", action="store_true")
    args = parser.parse_args()
    config = SandboxConfig.from_env()
    if args.backend:
        config = config.model_copy(update={"backend": args.backend})
    ways: dict[str, Callable[[Item], tuple[str, float, float]]] = {}
    warm = Runner(config)
    ways["runner"] = via_runner(warm)
    if args.compare_cold:
        ways["runner, cold"] = via_runner(Runner(config.model_copy(update={"warm": False})))
    ways["bare pytest"] = via_bare_pytest(str(warm.runtime.python))
    chosen = items(args.n)
    workers = min(os.cpu_count() or 1, config.slots)
    rounds: list[dict[str, dict[str, Any]]] = []
    for turn in range(args.rounds):
        order = list(ways) if turn % 2 == 0 else list(reversed(ways))
        rounds.append({name: timed(ways[name], chosen, workers) for name in order})
    summary: dict[str, Any] = {
        "backend": config.backend,
        "samples_per_round": len(chosen),
        "rounds": args.rounds,
        "workers": workers,
    }
    for name in ways:
        rates = [r[name]["samples_per_s"] for r in rounds]
        ratios = [r[name]["samples_per_s"] / r["bare pytest"]["samples_per_s"] for r in rounds]
        summary[name] = {
            "samples_per_s": round(statistics.median(rates), 2),
            "x_bare_pytest_median": round(statistics.median(ratios), 3),
            "x_bare_pytest_spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "cpu_s_per_sample_all_in": round(
                statistics.median(r[name]["cpu_s_per_sample"] for r in rounds), 4
            ),
            "grader_cpu_s_per_sample": round(
                statistics.median(r[name]["grader_cpu_s_per_sample"] for r in rounds), 4
            ),
        }
    # Each sample's own wall time (in the same parallel run), by kind: where the ratio comes
    # from (a sample that times out costs its limit either way).
    summary["median_ms_by_kind"] = {
        kind: {
            name: round(
                1000
                * statistics.median(
                    r[name]["walls"][i]
                    for r in rounds
                    for i, item in enumerate(chosen)
                    if item.kind == kind
                ),
                1,
            )
            for name in ways
        }
        for kind in dict.fromkeys(item.kind for item in chosen)
    }
    summary["rewards_differ"] = sorted(
        {
            (
                item.task.task_id,
                item.kind,
                r["runner"]["rewards"][i],
                r["bare pytest"]["rewards"][i],
            )
            for r in rounds
            for i, item in enumerate(chosen)
            if r["runner"]["rewards"][i] != r["bare pytest"]["rewards"][i]
        }
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
