"""A warm grader gives a sample the status and the peak memory a cold start gives it (within
16 MiB of two cold runs' range), on both backends, for the kinds of sample whose figures the
warm path could move: an honest one, one that imports numpy, one that holds 60 MiB, one past
its memory, one that forks, one past its time. benchmarks/warm_parity.py does the same for
every row of the hostile, red-team and HumanEval corpora."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Sample, Status, Task
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

TOLERANCE_MB = 16.0
BLOB_MB = 48
HOLD = "HELD = bytearray({mb} * 2**20)\nHELD[::4096] = b'x' * len(HELD[::4096])\n"
FORKS = """import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""
SAMPLES = {
    "honest": CORRECT,
    "numpy": "import numpy\n" + CORRECT,
    "holds_60_mib": (
        "def add(a, b):\n    held = bytearray(60 * 2**20)\n"
        "    held[::4096] = b'x' * len(held[::4096])\n    return a + b\n"
    ),
    "past_its_memory": HOLD.format(mb=400) + CORRECT,
    "forks": FORKS + CORRECT,
    "past_its_time": "while True:\n    pass\n" + CORRECT,
}
DECLARED = {
    "honest": Status.SUCCEEDED,
    "numpy": Status.SUCCEEDED,
    "holds_60_mib": Status.SUCCEEDED,
    "past_its_memory": Status.OOM,
    "forks": Status.SUCCEEDED,
    "past_its_time": Status.TIMEOUT,
}


# Room for every sample meant to finish on a loaded machine; the one that spins is stopped
# sooner (its CPU is the suite's: three runs of it on each of four cases).
ROOM_S = 5.0
TIMEOUT_S = {"past_its_time": 2.0}


def _task(isolation: str, timeout_s: float = ROOM_S) -> Task:
    raw: dict[str, Any] = json.loads(json.dumps(ADD_TASK))
    raw["grading"] |= {"isolation": isolation}
    raw["limits"] = {"timeout_s": timeout_s, "memory_mb": 256}
    return Task.model_validate(raw)


def _peak(result: ExecutionResult) -> float:
    return [c for c in result.commands if c.phase == "grading"][-1].peak_memory_mb


@pytest.mark.parametrize("isolation", ["in_process", "boundary"])
@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_warm_gives_each_sample_its_cold_status_and_peak(backend: str, isolation: str) -> None:
    config = SandboxConfig.from_env().model_copy(update={"backend": backend})
    warm, cold = Runner(config), Runner(config.model_copy(update={"warm": False}))
    differ = {}
    for name, code in SAMPLES.items():
        task = _task(isolation, TIMEOUT_S.get(name, ROOM_S))
        sample = Sample(task_id=task.task_id, sample_id=name, files={"solution.py": code})

        def run(runner: Runner, task: Task = task, sample: Sample = sample) -> ExecutionResult:
            return score(task.grading, runner.run(task, sample))

        first, warmed, second = run(cold), run(warm), run(cold)
        statuses = {first.status, warmed.status, second.status}
        low, high = sorted((_peak(first), _peak(second)))
        # A sample past its memory is killed where the limit is: its peak is the limit's.
        peaks_agree = warmed.status == Status.OOM or (
            low - TOLERANCE_MB <= _peak(warmed) <= high + TOLERANCE_MB
        )
        if statuses != {DECLARED[name]} or not peaks_agree:
            differ[name] = (first.status, warmed.status, second.status, low, high, _peak(warmed))
    assert differ == {}


def test_a_samples_peak_counts_nothing_an_earlier_sample_on_its_slot_read() -> None:
    """Was a break (it failed the parity above in fresh runs): on cgroup v1 a slot's memory
    cgroup outlived its sample, and the page cache a sample read stayed charged to it, so
    every later sample on the slot peaked that much higher (an honest sample at 21 MiB, then
    49 after one that imported numpy). A file nothing else has read stands for the libraries:
    the first sample reads it, and is charged for its pages; the next is not."""
    config = SandboxConfig.from_env().model_copy(update={"backend": "bwrap", "warm": False})
    runner = Runner(config.model_copy(update={"slots": 1}))
    task = _task("in_process")
    blob = Path(f"/usr/local/share/trialbox-test-{uuid.uuid4().hex}.bin")  # sandboxes see /usr
    with open(blob, "wb") as handle:
        handle.write(os.urandom(BLOB_MB << 20))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # not cached
    blob.chmod(0o644)
    reads = f"with open({str(blob)!r}, 'rb') as f:\n    while f.read(1 << 20):\n        pass\n"

    def peak(name: str, code: str) -> float:
        sample = Sample(task_id=task.task_id, sample_id=name, files={"solution.py": code})
        result = score(task.grading, runner.run(task, sample))
        assert result.status == Status.SUCCEEDED, result.error
        return _peak(result)

    try:
        before = peak("honest", CORRECT)
        assert peak("reads", reads + CORRECT) >= before + BLOB_MB / 2  # charged while it ran
        assert peak("honest again", CORRECT) <= before + 4
    finally:
        blob.unlink()
