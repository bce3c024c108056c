"""A stopped run (trialbox.sandbox.slots.Slot.stop) leaves its slot as a finished one does, on
both backends: no process, no file, no descriptor of the worker's, and nothing the next job in
the same slot can see. A runner of one slot, apart from every other runner's (a reservation),
so that the next job runs in the stopped one's slot. Found by a red team: a stop before a
command started leaked its inherited descriptors (4 a grading)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.performance_attacks import perf_task
from tests.support.pools import reserve
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Sample, Status, Task
from trialbox.sandbox import processes
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    own = reserve()
    config = SandboxConfig.from_env().model_copy(update={
        "backend": request.param, "slots": 1, "uid_base": own.uid_base,
        "state_dir": own.state_dir})  # fmt: skip
    runner = Runner(config)
    try:
        yield runner
    finally:
        processes.kill_all(runner.slots.slot(0).uids)


def fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _task(**changes: object) -> Task:
    raw = json.loads(json.dumps(ADD_TASK)) | {"limits": {"timeout_s": 60, "memory_mb": 512}}
    return Task.model_validate(raw | changes)


def _clean(runner: Runner) -> list[str]:
    slot = runner.slots.slot(0)
    left = [f"process {p}" for p in processes.processes_of(slot.uids)]
    left += [str(p) for p in (slot.work_dir, slot.grade_dir, slot.root / "timed-solution")
             if p.exists()]  # fmt: skip
    # Its own slot's marker: a seat's state dir may hold another module's, still quarantined.
    left += [str(p) for p in runner.slots.locks_dir.glob(f"{slot.index}.dirty")]
    return left + runner.residue()


def test_a_stop_before_a_command_starts_closes_its_descriptors(runner: Runner) -> None:
    task = _task()
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT})
    runner.run(task, sample, stop=threading.Event())  # warm: lazily opened descriptors
    before = fds()
    for _ in range(5):
        stop = threading.Event()
        stop.set()  # the claim moved on just before grading started
        report = runner.run(task, sample, stop=stop)
        assert report.status == Status.SANDBOX_ERROR and "stopped" in (report.error or "")
    assert fds() == before


def test_a_stop_during_grading_with_its_companion_leaves_nothing(runner: Runner) -> None:
    hidden = {"tests/test_add.py": "import time\nfrom solution import add\n"
              "def test_slow():\n    assert add(1, 2) == 3\n    time.sleep(50)\n"}  # fmt: skip
    task = _task(hidden_tests=hidden, grading=ADD_TASK["grading"] | {"expected_tests": None})
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT})
    stop = threading.Event()
    threading.Timer(4.0, stop.set).start()
    started = time.monotonic()
    report = runner.run(task, sample, stop=stop)
    took = time.monotonic() - started
    # The stop ended it, not the test's 50 s sleep (a loaded fresh run took 10.2 s).
    assert took < 30 and report.status == Status.SANDBOX_ERROR
    assert _clean(runner) == []


def test_a_stop_during_the_performance_scorer_leaves_nothing(runner: Runner) -> None:
    task = perf_task(repeats=21)
    sample = Sample(task_id=task.task_id, sample_id="s",
                    files={"solution.py": "def total(n):\n    return sum(range(n))\n"})  # fmt: skip
    stop = threading.Event()
    real = runner._measure

    def measure(*args: object) -> object:  # stopped 1 s into the timed runs
        threading.Timer(1.0, stop.set).start()
        return real(*args)  # type: ignore[arg-type]

    runner._measure = measure  # type: ignore[method-assign,assignment]
    started = time.monotonic()
    try:
        report = runner.run(task, sample, stop=stop)
    finally:
        del runner._measure
    took = time.monotonic() - started
    assert report.status == Status.SANDBOX_ERROR and took < 12
    assert _clean(runner) == []


def test_the_next_job_in_a_stopped_slot_sees_nothing_of_it(runner: Runner) -> None:
    task = _task()
    plant = ("echo left > /tmp/rt-left; echo left > /dev/shm/rt-left; echo left > left;"
             " setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 & sleep 60")  # fmt: skip
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT},
                    commands=[["sh", "-c", plant]])  # fmt: skip
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    report = runner.run(task, sample, stop=stop)
    assert report.status == Status.SANDBOX_ERROR
    assert _clean(runner) == []
    # The slot's own processes only: under rlimit the host's (other tests') are visible too.
    mine = ",".join(str(uid) for uid in runner.slots.slot(0).uids)
    look = (
        "ls -a /tmp /dev/shm . | grep -x -e rt-left -e left;"
        " cat /tmp/rt-left /dev/shm/rt-left left 2>/dev/null;"
        f" ps -o pid=,uid=,args= -u {mine} 2>/dev/null | grep 'sleep 300' | grep -v grep; true"
    )
    sample2 = Sample(task_id=task.task_id, sample_id="s2", files={"solution.py": CORRECT},
                     commands=[["sh", "-c", look]])  # fmt: skip
    after = runner.run(task, sample2)
    out = after.commands[0].stdout
    assert "left" not in out and "sleep 300" not in out
