"""The performance scorer's task and the solutions that attack its timed runs (issue 22): one
that carries its results from one timed run to the next, one that leaves memory charged where
the reference's next run would pay for it, and one that sleeps through its timed runs. Shared
by the bwrap, Fargate and red-team tests."""

from __future__ import annotations

import json
from typing import Any

from trialbox.models import Task

REFERENCE = "def total(n):\n    return sum(range(n))\n"
WORKLOAD = "from solution import total\nprint(total(3_000_000))\n"
PERF_TASK: dict[str, Any] = {
    "task_id": "perf-total",
    "workspace": {"solution.py": "def total(n):\n    raise NotImplementedError\n"},
    "reference": {"solution.py": REFERENCE},
    "hidden_tests": {
        "tests/test_total.py": "from solution import total\n"
        "def test_small():\n    assert total(10) == 45\n"
    },
    "grading": {
        "command": ["python", "-m", "pytest", "-q", "tests"],
        "scorer": "performance",
        "performance": {"workload": WORKLOAD, "repeats": 5, "tolerance": 0.5},
    },
    "limits": {"timeout_s": 20, "memory_mb": 512},
}

# Several times the reference's CPU: honestly, its speed factor is about 0.25.
SLOW = (
    "def _slow(n):\n"
    "    for _ in range(4):\n"
    "        t = 0\n"
    "        for i in range(n):\n"
    "            t += i\n"
    "    return t\n"
)
# Every place a timed run could leave something for the next: the workspace, HOME, TMPDIR,
# the shared /tmp and /dev/shm of a backend without private ones.
_PLACES = (
    "import os\n"
    "def _places(n):\n"
    "    homes = ['.', os.environ.get('HOME', '.'), os.environ.get('TMPDIR', '.'),\n"
    "             '/tmp', '/dev/shm']\n"
    "    return [os.path.join(place, f'.total-{n}') for place in homes]\n"
)
CARRIES_RESULTS = (
    SLOW + _PLACES + "def total(n):\n"
    "    for path in _places(n):\n"
    "        try:\n"
    "            with open(path) as cached:\n"
    "                return int(cached.read())\n"
    "        except (OSError, ValueError):\n"
    "            pass\n"
    "    result = _slow(n)\n"
    "    for path in _places(n):\n"
    "        try:\n"
    "            with open(path, 'w') as cache:\n"
    "                cache.write(str(result))\n"
    "        except OSError:\n"
    "            pass\n"
    "    return result\n"
)

# The reference needs most of the memory limit; the solution leaves 100 MiB of files behind in
# its timed run, in a tmpfs charged to the slot's memory (and in every writable place).
BALLAST_MB = 100
MEMORY_HUNGRY_REFERENCE = (
    "def total(n):\n    block = b'x' * (170 << 20)\n    return sum(range(n)) + len(block) * 0\n"
)
LEAVES_BALLAST = (
    _PLACES + "def total(n):\n"
    "    if n > 1000:\n"
    "        for path in _places(n):\n"
    "            try:\n"
    "                with open(path, 'wb') as ballast:\n"
    f"                    ballast.write(b'x' * ({BALLAST_MB} << 20))\n"
    "                break\n"
    "            except OSError:\n"
    "                pass\n"
    "    return sum(range(n))\n"
)
# The same ballast, left by an agent command before grading.
BALLAST_COMMAND = ["python", "-c", f"open('ballast', 'wb').write(b'x' * ({BALLAST_MB} << 20))"]

SLEEP_S = 1.5
SLEEPS = f"import time\ndef total(n):\n    if n > 1000:\n        time.sleep({SLEEP_S})\n    return sum(range(n))\n"  # noqa: E501


def perf_task(**changes: Any) -> Task:
    """The task, with `reference`, `limits` or `performance` fields changed."""
    raw = json.loads(json.dumps(PERF_TASK))
    if "reference" in changes:
        raw["reference"] = {"solution.py": changes.pop("reference")}
    if "limits" in changes:
        raw["limits"] = changes.pop("limits")
    raw["grading"]["performance"] |= changes
    return Task.model_validate(raw)


def grading_calls_workload_task() -> Task:
    """The hidden tests call the solution with the workload's input: under the boundary, its
    process does so in the agent's workspace, where it could leave the answer for the timed
    runs."""
    task = perf_task()
    test = task.hidden_tests["tests/test_total.py"]
    big = "def test_big():\n    assert total(3_000_000) == 4499998500000\n"
    return task.model_copy(update={"hidden_tests": {"tests/test_total.py": f"{test}{big}"}})


def memory_task() -> Task:
    # 256 MiB: the reference's run fits with 100 MiB to spare, not with the ballast charged.
    return perf_task(
        reference=MEMORY_HUNGRY_REFERENCE,
        limits={"timeout_s": 20, "memory_mb": 256, "disk_mb": 120},
    )


def sleep_task() -> Task:
    return perf_task(repeats=3, limits={"timeout_s": 2, "memory_mb": 256})
