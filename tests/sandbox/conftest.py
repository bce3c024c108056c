"""Real bubblewrap sandboxes: these tests need root, bwrap and the runtime from `make setup`."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trialbox.models import Limits, Sample, Task
from trialbox.models.report import CommandResult, RunReport
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

ADD_TASK: dict[str, Any] = {
    "task_id": "add-two",
    "prompt": "Write add(a, b) in solution.py",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": (
            "from solution import add\n"
            "def test_small():\n    assert add(1, 2) == 3\n"
            "def test_negative():\n    assert add(-1, -2) == -3\n"
        )
    },
    "grading": {
        "command": ["python", "-m", "pytest", "-q", "tests"],
        "scorer": "tests_pass_fraction",
        "expected_tests": ["tests/test_add.py::test_small", "tests/test_add.py::test_negative"],
    },
    "limits": {"timeout_s": 10, "memory_mb": 512},
}
CORRECT = "def add(a, b):\n    return a + b\n"
# A planted conftest that rewrites every report to "passed".
FORCE_PASS_CONFTEST = (
    "import pytest\n"
    "@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    report = outcome.get_result()\n"
    "    report.outcome, report.longrepr = 'passed', None\n"
)

# Hostile programs both backends are tested against.
FORK_BOMB = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    while True:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print(n, e.errno)\n"
)
SETSID_DAEMON = (
    "import os, signal, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        time.sleep(120)\n"
    "    os._exit(0)\n"
    "time.sleep(0.2)\n"
    "print('parent done')\n"
)


@pytest.fixture(scope="session")
def runner() -> Runner:
    return Runner()


Exec = Callable[..., CommandResult]


@pytest.fixture
def run_exec(runner: Runner) -> Exec:
    def run(code: str, **limits: Any) -> CommandResult:
        return runner.exec(["python", "-c", code], Limits(**limits))

    return run


Grade = Callable[..., tuple[RunReport, ExecutionResult]]


@pytest.fixture
def grade(runner: Runner) -> Grade:
    def run(
        files: dict[str, Any],
        commands: list[list[str]] | None = None,
        isolation: str | None = None,
        **task_changes: Any,
    ) -> tuple[RunReport, ExecutionResult]:
        """`isolation="in_process"`: the guards for tasks that import the solution in pytest."""
        raw = json.loads(json.dumps(ADD_TASK)) | task_changes
        if isolation is not None:
            raw["grading"] = raw["grading"] | {"isolation": isolation}
        task = Task.model_validate(raw)
        sample = Sample(task_id=task.task_id, sample_id="s", files=files, commands=commands or [])
        report = runner.run(task, sample)
        return report, score(task.grading, report)

    return run


@contextlib.contextmanager
def secret_in_another_slot(runner: Runner) -> Iterator[Path]:
    """A sandbox in another slot holds a secret file; yields its host path while it runs."""
    secret = f"secret-{uuid.uuid4()}"
    other = threading.Thread(
        target=runner.exec, args=(["sh", "-c", f"echo {secret} > mine; sleep 3"], Limits())
    )
    other.start()
    try:
        deadline = time.monotonic() + 5
        found: list[Path] = []
        while not found and time.monotonic() < deadline:
            found = list(runner.slots.slots_dir.glob("*/work/mine"))
            time.sleep(0.05)
        assert found, "the other sandbox never wrote its secret"
        yield found[0]
    finally:
        other.join()


# Leaves something in every place a uid can reach outside its workspace on an rlimit worker:
# a setsid daemon holding a lock, files in /tmp, /var/tmp and /dev/shm, SysV shared memory,
# a semaphore set and a message queue, and a key in its user and persistent keyrings. Prints
# what it managed.
LEFTOVERS = r"""
import ctypes, fcntl, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
made = []
for place in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(f"{place}/trialbox-leftover-{os.getuid()}", "w") as f:
            f.write("secret")
        made.append(place)
    except OSError:
        pass
if libc.shmget(0x7B0001, 4096, 0o1666) >= 0: made.append("shm")
if libc.semget(0x7B0002, 1, 0o1666) >= 0: made.append("sem")
if libc.msgget(0x7B0003, 0o1666) >= 0: made.append("msg")
add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
if libc.syscall(add_key, b"user", b"trialbox-leftover", b"secret", 6, -4) > 0: made.append("key")
keyctl = {"x86_64": 250, "aarch64": 219}[platform.machine()]
ring = libc.syscall(keyctl, 22, -1, -2)  # KEYCTL_GET_PERSISTENT into the process keyring
if ring > 0 and libc.syscall(add_key, b"user", b"trialbox-p", b"secret", 6, ring) > 0:
    made.append("persistent-key")
if libc.syscall(add_key, b"user", b"trialbox-s", b"secret", 6, -3) > 0:  # the session keyring
    made.append("session-key")
if os.fork() == 0:
    os.setsid()
    lock = open("/tmp/trialbox-leftover.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    time.sleep(120)
    os._exit(0)
print(" ".join(made))
"""
