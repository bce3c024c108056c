"""The warm grader (trialbox/sandbox/warm.py, bwrap_warm.py): what one sample does to the
interpreter it was given, or around it, never reaches the next sample on the same slot, on
either backend.

A probe sample (warm_samples/probe.py) records what its interpreter looks like; an attacking
sample (warm_samples/attack.py) then plants something in each place listed below and signals
every ancestor it can; a second probe must see exactly what the first saw, from a fork of the
same warm process. Each attack is shown to reach the next sample against a deliberately naive
warm process (tests/support/naive_warm_process.py: it runs the samples itself), so none of
these checks could pass for want of an attack that works."""

from __future__ import annotations

import gc
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.tasks import ADD_TASK
from trialbox.errors import SandboxError
from trialbox.models import Sample, Status, Task
from trialbox.models.report import RunReport
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.sandbox.runtime import POLICY_MODULE
from trialbox.sandbox.warm import WarmPool

SAMPLES = Path(__file__).with_name("warm_samples")
NAIVE = Path(__file__).parents[1] / "support" / "naive_warm_process.py"
OBSERVED = re.compile(r"OBSERVED (\{.*\})")
PROBE_TEST = (
    "import json\nfrom solution import observe\n"
    "def test_observe():\n    raise AssertionError('OBSERVED ' + json.dumps(observe()))\n"
)
# What the attack plants, by the probe's name for where it looks.
PLANTED = (
    "builtins",
    "module attribute",
    "sys.modules",
    "sys.path",
    "meta_path",
    "path_importer_cache",
    "atexit",
    "threads",
    "signals",
    "environment",
    "cwd",
    "umask",
    "memory",
)
# Left outside the interpreter: the backend's wipe after each command removes them, warm or
# cold (tests/sandbox/test_rlimit.py), so the naive process leaks them no more than this one.
AROUND = ("/tmp", "/dev/shm", "HOME")


def _task(isolation: str) -> Task:
    raw: dict[str, Any] = json.loads(json.dumps(ADD_TASK))
    raw["hidden_tests"] = {"tests/test_probe.py": PROBE_TEST}
    raw["grading"] |= {"isolation": isolation, "expected_tests": None}
    return Task.model_validate(raw)


def _observed(report: RunReport, strict: bool = True) -> dict[str, Any]:
    """What the probe saw. Not `strict`: {} when it could not say (an attack on the naive
    process broke the trusted plugin's report: that attack reached the probe too)."""
    messages = [t.message or "" for t in report.grading.tests] if report.grading else []
    found = [m for m in map(OBSERVED.search, messages) if m]
    assert found or not strict, (messages, report.commands[-1].stderr)
    return dict(json.loads(found[0].group(1))) if found else {}


def _run(
    runner: Runner, task: Task, sample: str, n: int, plant: list[str] | None = None
) -> RunReport:
    """`plant`: the attacks attack.py makes (else every one)."""
    code = (SAMPLES / sample).read_text()
    if plant is not None:
        code = code.replace("\nPLANT = None", f"\nPLANT = {plant!r}", 1)
    files = {"solution.py": code}
    return runner.run(task, Sample(task_id=task.task_id, sample_id=f"{sample}-{n}", files=files))


def _runner(program: Path | None, backend: str = "rlimit") -> Runner:
    config = SandboxConfig.from_env().model_copy(update={"backend": backend, "slots": 1})
    runner = Runner(config)
    if program is not None:
        runner.backend.warm = WarmPool(runner.runtime.python, program)
    return runner


def _module(isolation: str) -> str:
    """The warm process the sample's code runs in."""
    return "pytest" if isolation == "in_process" else POLICY_MODULE


def _before_and_after(runner: Runner, isolation: str) -> tuple[dict[str, Any], dict[str, Any]]:
    task = _task(isolation)
    before = _observed(_run(runner, task, "probe.py", 1))
    _run(runner, task, "attack.py", 2)
    return before, _observed(_run(runner, task, "probe.py", 3))


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
@pytest.mark.parametrize("isolation", ["in_process", "boundary"])
def test_nothing_a_sample_plants_reaches_the_next_sample_on_its_slot(
    isolation: str, backend: str
) -> None:
    """Every attack at once, the ancestors' signals included."""
    runner = _runner(None, backend)
    before, after = _before_and_after(runner, isolation)
    assert set(PLANTED + AROUND) <= set(before)
    assert {k: (before[k], after[k]) for k in before if before[k] != after[k]} == {}
    # Both probes ran from the same warm process, which the attack could not stop or kill.
    warm = runner.backend.warm
    assert warm is not None
    server = warm.server(0, _module(isolation))
    assert server is not None and server.alive()
    assert server.launched == 3


def test_each_attack_reaches_the_next_sample_through_a_naive_warm_process() -> None:
    """Each attack reaches the probe after it through a naive process of its own, against
    what a fresh one shows: those that leave the naive process's grading working together in
    one, the two that break it (a patched `json.dumps`, the working directory) apart: the
    probe that cannot even report counts as reached. in_process: the sample's code runs in the
    grader's process, which is the naive warm process itself."""
    task = _task("in_process")
    before = _observed(_run(_runner(NAIVE), task, "probe.py", 1))
    breaking = ["module attribute", "cwd"]
    groups = [[p for p in PLANTED if p not in breaking], *([p] for p in breaking)]
    missed = []
    for group in groups:
        runner = _runner(NAIVE)
        _run(runner, task, "attack.py", 2, group)
        after = _observed(_run(runner, task, "probe.py", 3), strict=False)
        missed += [plant for plant in group if before[plant] == after.get(plant)]
    assert missed == [], missed


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_a_warm_process_that_died_is_replaced(backend: str) -> None:
    runner = _runner(None, backend)
    task = _task("in_process")
    before = _observed(_run(runner, task, "probe.py", 1))
    warm = runner.backend.warm
    assert warm is not None
    dead = warm.server(0, "pytest")
    assert dead is not None
    dead.proc.kill()
    dead.proc.wait()
    assert _observed(_run(runner, task, "probe.py", 2)) == before
    replaced = warm.server(0, "pytest")
    assert replaced is not None and replaced is not dead
    assert replaced.alive() and replaced.launched == 1


@pytest.mark.parametrize("policy_warm", [True, False])
def test_the_policys_sandbox_started_beside_the_graders_is_taken_or_reaped(
    policy_warm: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap makes the policy's sandbox (its holder) beside the grader's, not after it. Taken
    by the policy's warm launch; when that launch goes cold instead, the unused holder dies
    with the slot's cgroup and is reaped at the command's end: nothing is left for the next."""
    runner = _runner(None, "bwrap")
    warm = runner.backend.warm
    assert warm is not None
    if not policy_warm:
        launch = warm.launch
        monkeypatch.setattr(
            warm,
            "launch",
            lambda slot, module, command: (
                None if module == POLICY_MODULE else launch(slot, module, command)
            ),
        )
    task = _task("boundary")
    for n in range(2):
        report = _run(runner, task, "probe.py", n)
        assert report.grading is not None and _observed(report)
        assert runner.backend.early_holders == {}  # type: ignore[attr-defined]
    server = warm.server(0, POLICY_MODULE)
    assert (server.launched if server else 0) == (2 if policy_warm else 0)


def test_a_warm_launch_that_fails_leaves_no_sandbox_and_no_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (a red team's): a grader's warm launch that raised (its warm process did not
    answer) left the policy's early sandbox unreaped and 7 descriptors open, each time."""
    runner = _runner(None, "bwrap")
    task = _task("boundary")
    _run(runner, task, "probe.py", 0)  # every warm process started, every lazy import done
    warm = runner.backend.warm
    assert warm is not None
    launch = warm.launch

    def unanswered(slot: int, module: str, command: Any) -> Any:
        if module != POLICY_MODULE:
            raise SandboxError("the warm process did not answer")
        return launch(slot, module, command)

    monkeypatch.setattr(warm, "launch", unanswered)
    gc.collect()  # what earlier tests left for the collector closes now, not in the count
    open_fds = len(os.listdir("/proc/self/fd"))
    for n in range(1, 4):
        report = _run(runner, task, "probe.py", n)
        assert report.status == Status.SANDBOX_ERROR
        assert runner.backend.early_holders == {}  # type: ignore[attr-defined]
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= open_fds  # 7 more for each failure, before
