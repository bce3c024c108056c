"""Slots are machine-wide, and a runner killed mid-run leaves nothing the next one keeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.tasks import ADD_TASK
from trialbox.errors import SandboxError, SandboxSetupError
from trialbox.models import Limits, Sample, Task
from trialbox.sandbox import processes
from trialbox.sandbox.processes import processes_of
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

HOLDER = textwrap.dedent(
    """
    import sys
    from trialbox.models import Limits
    from trialbox.sandbox.config import SandboxConfig
    from trialbox.sandbox.runner import Runner
    config = SandboxConfig.from_env().model_copy(update={"backend": sys.argv[1]})
    Runner(config).exec(["sh", "-c", "echo started > marker; sleep 300"], Limits(timeout_s=600))
    """
)


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_a_runner_killed_mid_run_is_swept_by_the_next(runner: Runner, backend: str) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, backend], start_new_session=True)
    slots = runner.slots
    deadline = time.monotonic() + 20
    markers: list = []
    while not markers and time.monotonic() < deadline:
        markers = list(slots.slots_dir.glob("*/work/marker"))
        time.sleep(0.05)
    assert markers, "the holder never started its sandbox"
    index = int(markers[0].parent.parent.name)
    slot = slots.slot(index)
    os.killpg(holder.pid, signal.SIGKILL)  # the runner dies; its sandbox does not
    holder.wait()
    time.sleep(0.2)
    if backend == "bwrap":  # --die-with-parent: the sandbox went with its runner
        assert os.path.ismount(slot.work_dir)
    else:  # a setsid'd tree outlives its runner: only the sweep can end it
        assert processes_of(slot.uids), "the orphaned sandbox should still be running"
    assert slot.work_dir.exists()
    assert (slots.locks_dir / f"{index}.dirty").exists()

    config = runner.config.model_copy(update={"backend": backend})
    Runner(config)  # a new runner's startup sweep
    assert processes_of(slot.uids) == []
    assert not os.path.ismount(slot.work_dir) and not slot.work_dir.exists()
    assert not (slots.locks_dir / f"{index}.dirty").exists()


def test_busy_slots_give_a_clear_error_after_the_wait(runner: Runner) -> None:
    config = runner.config.model_copy(update={"slots": 1, "slot_wait_s": 0.3})
    single = Runner(config)
    result = single.exec(["true"], Limits())
    assert result.exit_code == 0
    with (
        single.slots.acquire(),
        pytest.raises(SandboxSetupError, match="all 1 sandbox slots stayed busy for 0 s"),
    ):
        single.exec(["true"], Limits())


def test_disk_clamp_is_noted_in_the_result(runner: Runner) -> None:
    task = Task.model_validate(ADD_TASK | {"limits": {"memory_mb": 64, "disk_mb": 64}})
    sample = Sample(task_id=task.task_id, sample_id="clamp")
    result = score(task.grading, runner.run(task, sample))
    assert result.notes == [
        "disk_mb 64 clamped to 32 (half of memory_mb 64): the workspace is a tmpfs charged "
        "to the memory limit"
    ]
    assert result.provenance is not None and result.provenance.limits.disk_mb == 32


def test_a_slot_the_rlimit_backend_left_dirty_is_swept_by_a_bwrap_runner(runner: Runner) -> None:
    """A machine that has both backends (the tests, a worker image on a bwrap host): a slot
    whose last rlimit holder died leaves a plain directory with files, not a tmpfs."""
    slots = runner.slots
    with slots.idle([0]) as held:
        assert held, "slot 0 is busy"
        (slot,) = held
        slot.work_dir.mkdir(parents=True, exist_ok=True)
        (slot.work_dir / "left").write_text("by a dead rlimit runner")
    (slots.locks_dir / "0.dirty").touch()
    config = runner.config.model_copy(update={"backend": "bwrap"})
    Runner(config)  # its startup sweep
    assert not (slot.work_dir / "left").exists()
    assert not (slots.locks_dir / "0.dirty").exists()


def test_a_kill_that_outlasts_its_wait_names_each_survivors_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slot uid's process still there, and not dying, when the wait ends is a SandboxError
    that says what state each survivor was in (stopped, in the kernel, running), so a rare one
    says why. One with SIGKILL pending is dying: it is handed back, never an error."""
    uid = int(os.environ["TRIALBOX_SANDBOX_UID_BASE"]) + 4000  # this process's, no slot's
    survivor = subprocess.Popen(["sleep", "60"], user=uid, group=uid)
    monkeypatch.setattr(processes, "WAIT_GONE_S", -1.0)  # the wait is over at once
    send = processes._signal
    try:
        monkeypatch.setattr(
            processes, "_signal", lambda pids, uids, sig: None
        )  # a kill that missed
        assert not processes.dying(survivor.pid)
        with pytest.raises(
            SandboxError, match=rf"survived SIGKILL: \{{{survivor.pid}: '[A-Za-z]+'\}}"
        ):
            processes.kill_all((uid,))
        monkeypatch.setattr(processes, "_signal", send)
        assert processes.kill_all((uid,)) == [survivor.pid]  # signalled, so dying
    finally:
        survivor.kill()
        survivor.wait()
