"""Warm against cold on either backend: for every sample of a corpus, the status, reward and
grading command's peak memory a warm grader gives (trialbox/sandbox/warm.py) against cold
starts', each row run cold, warm, then cold again (or warm first, by turns).

Corpora: `hostile` (tests/redteam/corpus.py), `redteam` (tests/redteam/hacks.py), `humaneval`
(the 164 canonical solutions). A row agrees when the status is the same as both cold runs'
(and the reward too, but for the performance scorer's, which is timed), and the warm peak is
within TOLERANCE_MB of the two cold peaks' range. A peak that is timing itself (a fork bomb's,
or a memory bomb's caught by the watchdog's sampling) moves between two cold runs too: the
range is how much. Exit status 1 when a row does not agree.

Run: `.venv/bin/python benchmarks/warm_parity.py --backend rlimit` (every corpus by default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # the corpora live with the tests

from tests.redteam.corpus import HOSTILE, Hostile
from tests.redteam.hacks import HACKS, Hack
from trialbox.models import ExecutionResult, Sample, Task
from trialbox.qc import humaneval
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TOLERANCE_MB = 16.0


@dataclass(frozen=True)
class Row:
    corpus: str
    name: str
    task: Task
    sample: Sample


@dataclass(frozen=True)
class Pair:
    row: Row
    cold: tuple[ExecutionResult, ExecutionResult]
    warm: ExecutionResult

    @staticmethod
    def peak(result: ExecutionResult) -> float:
        graded = [c for c in result.commands if c.phase == "grading"]
        return graded[-1].peak_memory_mb if graded else 0.0

    def disagreement(self) -> str | None:
        warm = self.warm
        timed = self.row.task.grading.performance is not None
        for cold in self.cold:
            if cold.status != warm.status or (not timed and cold.reward != warm.reward):
                seen = f"{warm.status.value} {warm.reward}"
                return f"cold {cold.status.value} {cold.reward}, warm {seen}"
        low, high = sorted(self.peak(cold) for cold in self.cold)
        if not low - TOLERANCE_MB <= self.peak(warm) <= high + TOLERANCE_MB:
            return f"peak cold {low:.1f}..{high:.1f} MiB, warm {self.peak(warm):.1f} MiB"
        return None


def rows(corpora: list[str]) -> Iterator[Row]:
    if "hostile" in corpora or "redteam" in corpora:
        chosen: list[Hack | Hostile] = [
            *(HOSTILE if "hostile" in corpora else []),
            *(HACKS if "redteam" in corpora else []),
        ]
        for hack in chosen:
            corpus = "hostile" if hack in HOSTILE else "redteam"
            sample = Sample(
                task_id=hack.task.task_id,
                sample_id=hack.name,
                files=hack.files,
                commands=hack.commands,
            )
            yield Row(corpus, hack.name, hack.task, sample)
    if "humaneval" in corpora:
        for raw in humaneval.tasks():
            task = Task.model_validate(raw)
            assert task.reference is not None
            sample = Sample(task_id=task.task_id, sample_id="ref", files=dict(task.reference))
            yield Row("humaneval", task.task_id, task, sample)


def runners(backend: str, slots: int) -> tuple[Runner, Runner]:
    config = SandboxConfig.from_env().model_copy(update={"backend": backend, "slots": slots})
    return Runner(config.model_copy(update={"warm": False})), Runner(config)


def compare(row: Row, cold: Runner, warm: Runner, warm_first: bool) -> Pair:
    def run(runner: Runner) -> ExecutionResult:
        return score(row.task.grading, runner.run(row.task, row.sample))

    if warm_first:
        warm_result = run(warm)
        return Pair(row, (run(cold), run(cold)), warm_result)
    first = run(cold)
    warm_result = run(warm)
    return Pair(row, (first, run(cold)), warm_result)


def compare_all(chosen: list[Row], backend: str, parallel: int) -> list[Pair]:
    cold, warm = runners(backend, parallel)
    with ThreadPoolExecutor(parallel) as pool:
        return list(
            pool.map(lambda i: compare(chosen[i], cold, warm, i % 2 == 1), range(len(chosen)))
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", default=["hostile", "redteam", "humaneval"])
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--backend", choices=["bwrap", "rlimit"], default="rlimit")
    args = parser.parse_args()
    pairs = compare_all(list(rows(args.corpus)), args.backend, args.parallel)
    print(f"{'corpus':<10} {'row':<40} {'cold':<24} {'warm':<24} peak cold, cold / warm MiB")
    for pair in pairs:
        c, w = pair.cold[0], pair.warm
        mark = "  !" if pair.disagreement() else ""
        cold, warm = f"{c.status.value} {c.reward}", f"{w.status.value} {w.reward}"
        peaks = f"{pair.peak(pair.cold[0]):.1f}, {pair.peak(pair.cold[1]):.1f} / {pair.peak(w):.1f}"
        print(f"{pair.row.corpus:<10} {pair.row.name[:40]:<40} {cold:<24} {warm:<24} {peaks}{mark}")
    bad = [(p.row.name, p.disagreement()) for p in pairs if p.disagreement()]
    deltas = [p.peak(p.warm) - p.peak(p.cold[0]) for p in pairs]
    print(
        f"\n{len(pairs)} rows, {len(bad)} disagree; peak warm - first cold: median "
        f"{statistics.median(deltas):+.1f}, min {min(deltas):+.1f}, max {max(deltas):+.1f} MiB"
    )
    for name, why in bad:
        print(f"  {name}: {why}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
