"""The hostile corpus, and the declared outcome every row of it and of the red-team corpus
(tests/redteam/hacks.py) must get on both backends.

Each row is a graded sample: a hostile program at import in the solution, or as an agent
command before a correct solution is graded. Its `expect` is written from the reward table
(docs/sandbox.md, `trialbox.models.result.REWARD_RULES`) before any run, never from what a
backend did: the policy's code overran its time (`timeout`) or its memory (`oom`), was caught
(`integrity_violation`), or simply ran (`succeeded`, the scorer's number). A graded sample's
status is its grading phase's, so what an agent command does to itself leaves a correct
solution's 1.0 alone. No row is expected to differ between backends, and none is masked: a
policy that could make one of these a `sandbox_error` would escape its negative reward.

Rows are appended by the helpers that add attacks; the shapes here stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.programs import (
    FORK_BOMB,
    SETSID_DAEMON,
    STOPPED_VFORK_PAIR,
    memory_spread,
    socket_buffers,
)
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import ExecutionResult, Status, Task


@dataclass(frozen=True)
class Expected:
    """A declared outcome: the status, the loss mask, and the reward exactly (`reward`) or a
    bound on it (`reward_at_most`, for a scorer whose number is a fraction). `or_status` is
    for a hack a detector catches by chance (the boundary's decoys are asked in a random
    order): either status, on either backend, with the same reward and mask."""

    status: Status
    loss_mask: bool
    reward: float | None = None
    reward_at_most: float | None = None
    or_status: Status | None = None

    @property
    def statuses(self) -> tuple[Status, ...]:
        return (self.status,) if self.or_status is None else (self.status, self.or_status)

    def matches(self, result: ExecutionResult) -> bool:
        if result.status not in self.statuses or result.loss_mask != self.loss_mask:
            return False
        if self.reward_at_most is not None:
            return result.reward is not None and result.reward <= self.reward_at_most
        return result.reward == self.reward

    def __str__(self) -> str:
        reward = f"<={self.reward_at_most}" if self.reward_at_most is not None else self.reward
        status = "|".join(s.value for s in self.statuses)
        return f"{status} {reward}{' masked' if self.loss_mask else ''}"


# From the reward table, one per row of it a hostile sample can reach.
SCORED_ZERO = Expected(Status.SUCCEEDED, loss_mask=False, reward=0.0)  # ran; the tests failed
SCORED_ONE = Expected(Status.SUCCEEDED, loss_mask=False, reward=1.0)  # ran; the tests passed
TIMED_OUT = Expected(Status.TIMEOUT, loss_mask=False, reward=0.0)  # overran its time
OUT_OF_MEMORY = Expected(Status.OOM, loss_mask=False, reward=0.0)  # overran its memory
CAUGHT = Expected(Status.INTEGRITY_VIOLATION, loss_mask=False, reward=0.0)  # a detected hack
# A hack right by chance: caught when it says yes to the real question and a decoy, else a
# plain wrong answer.
CAUGHT_BY_CHANCE = Expected(
    Status.INTEGRITY_VIOLATION, loss_mask=False, reward=0.0, or_status=Status.SUCCEEDED
)


def result_summary(result: ExecutionResult) -> str:
    """One table cell: what a backend gave, in `Expected`'s words."""
    return f"{result.status.value} {result.reward}{' masked' if result.loss_mask else ''}"


@dataclass(frozen=True)
class Hostile:
    name: str
    kind: str  # "at-import" (in the grader, with a wrong add) or "agent-command" (then graded)
    task: Task
    files: dict[str, Any]
    commands: list[list[str]]
    expect: Expected


# Every row's limits give its declared outcome a wide margin on a loaded machine (a full
# `make test` on 2 cores runs both corpora beside everything else). What is meant to overrun
# its time never ends, so it is stopped at OVERRUN_S by design: an agent command (whatever it
# does leaves the grading's status alone), or the grading of a row declared `timeout`
# (`overrunning`). The grading of every other row has ROOM_S, many times what it needs: a
# row meant to reach its memory limit does so in under a second unloaded, well under a
# tenth of ROOM_S at a load of ten, and one meant to finish costs only what it takes.
OVERRUN_S = 5
ROOM_S = 30
# memory_mb / pids / disk_mb are what the programs below are sized against.
LIMITS = {"timeout_s": OVERRUN_S, "memory_mb": 256, "pids": 64, "disk_mb": 32}
MEMORY_MB = LIMITS["memory_mb"]


def roomy(raw: dict[str, Any], **limits: int) -> dict[str, Any]:
    """A corpus task's JSON: LIMITS (with `limits` changed), and ROOM_S to grade."""
    return raw | {"limits": LIMITS | limits, "grading": raw["grading"] | {"timeout_s": ROOM_S}}


def overrunning(task: Task) -> Task:
    """`task` graded within OVERRUN_S: for a row declared to overrun its time."""
    grading = task.grading.model_copy(update={"timeout_s": OVERRUN_S})
    return task.model_copy(update={"task_id": f"{task.task_id}-overruns", "grading": grading})


ADD = Task.model_validate(roomy(ADD_TASK | {"task_id": "hostile-add"}))
ROOMY_MEMORY_MB = 512
ROOMY_ADD = Task.model_validate(
    roomy(ADD_TASK | {"task_id": "hostile-add-roomy"}, memory_mb=ROOMY_MEMORY_MB)
)
WRONG = "def add(a, b):\n    return 0\n"


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def at_import(code: str, solution: str = WRONG) -> dict[str, Any]:
    """`code` runs when the grader imports the solution."""
    return {"solution.py": code + "\n" + solution}


def processes_holding(count: int, mib: int) -> str:
    """`count` processes (the parent included) each touching `mib` MiB, all alive at once
    (no sleep: each child holds its pages until the parent, having touched its own and heard
    from every child, lets them go); then the parent goes on. Each is far under the limit
    alone. A child killed on the way closes its end too: nobody waits for it."""
    return (
        "import os\n"
        f"def _touch():\n    b = bytearray({mib} << 20)\n    b[::4096] = b'x' * len(b[::4096])\n"
        "    return b\n"
        "_ready_r, _ready_w = os.pipe()\n"
        "_release_r, _release_w = os.pipe()\n"
        "_kids = []\n"
        f"for _ in range({count - 1}):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(_ready_r)\n        os.close(_release_w)\n"
        "        _held = _touch()\n"
        "        os.write(_ready_w, b'x')\n        os.close(_ready_w)\n"
        "        os.read(_release_r, 1)\n"
        "        os._exit(0)\n"
        "    _kids.append(pid)\n"
        "os.close(_ready_w)\n"
        "os.close(_release_r)\n"
        "_mine = _touch()\n"
        "while os.read(_ready_r, 64):\n    pass\n"
        "os.close(_release_w)\n"
        "for pid in _kids:\n    os.waitpid(pid, 0)\n"
    )


MEMORY_HOG = "_chunks = []\nwhile True:\n    _chunks.append(b'x' * (8 << 20))\n"
DISK_FILL = (
    "for _place in ('fill', '/tmp/fill', '/dev/shm/fill'):\n"
    "    try:\n"
    "        with open(_place, 'wb') as f:\n"
    "            while True:\n"
    "                f.write(b'x' * (1 << 20))\n"
    "    except OSError:\n"
    "        pass\n"
)
INODE_FILL = (
    "import os\n"
    "os.makedirs('many', exist_ok=True)\n"
    "for _i in range(8000):\n"
    "    try:\n"
    "        os.close(os.open(f'many/{_i}', os.O_CREAT | os.O_WRONLY))\n"
    "    except OSError:\n"
    "        break\n"
)
# 12,000 names of one 1-byte file: 4 KiB live, 47 MiB if each name were copied as a file.
HARD_LINK_FLOOD = (
    "import os\n"
    "for _place in ('.', '/tmp'):\n"
    "    try:\n"
    "        open(f'{_place}/one', 'w').write('x')\n"
    "        os.makedirs(f'{_place}/links', exist_ok=True)\n"
    "        for _i in range(12000):\n"
    "            os.link(f'{_place}/one', f'{_place}/links/{_i}')\n"
    "        break\n"
    "    except OSError:\n"
    "        pass\n"
)
# Three files of 20 MiB each, all hole but their last byte: 12 KiB live, 60 MiB if filled.
SPARSE_FILES = (
    "for _place in ('.', '/tmp'):\n"
    "    try:\n"
    "        for _i in range(3):\n"
    "            with open(f'{_place}/sparse{_i}', 'wb') as f:\n"
    "                f.seek((20 << 20) - 1)\n"
    "                f.write(b'x')\n"
    "        break\n"
    "    except OSError:\n"
    "        pass\n"
)
OUTPUT_FLOOD = (
    "import os\n_chunk = b'x' * (1 << 20)\n"
    "for _ in range(20):\n    os.write(1, _chunk)\n    os.write(2, _chunk)\n"
)
CLOSE_EVERY_FD = "import os\nos.closerange(0, 1 << 16)\n"
# Detached, descriptors closed, SIGTERM and SIGHUP ignored, alive past the job.
LINGER = (
    "import os, signal, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "    os.closerange(0, 1 << 16)\n"
    "    time.sleep(120)\n"
    "    os._exit(0)\n"
)
# Its parent, then everything it may signal; a signal refused (EPERM) is no stop.
KILL_EVERYTHING = (
    "import contextlib, os, signal\n"
    "for _pid in (os.getppid(), -1):\n"
    "    with contextlib.suppress(OSError):\n"
    "        os.kill(_pid, signal.SIGKILL)\n"
)
STOP_ITSELF = "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n"
SPIN = "while True:\n    pass\n"
SLEEP = "import time\ntime.sleep(60)\n"

# The same hostile programs in both places; in the grader a program that overruns its time or
# memory is the policy's timeout or oom, and one that merely misbehaves scores its wrong add.
_PROGRAMS: list[tuple[str, str, Expected]] = [
    ("fork_bomb", FORK_BOMB, SCORED_ZERO),
    ("setsid_daemon", SETSID_DAEMON, SCORED_ZERO),
    ("lingering_daemon_no_fds", LINGER, SCORED_ZERO),
    ("memory_hog", MEMORY_HOG, OUT_OF_MEMORY),
    ("many_processes_memory", processes_holding(6, MEMORY_MB * 2 // 5), OUT_OF_MEMORY),
    ("disk_fill", DISK_FILL, SCORED_ZERO),
    ("inode_fill", INODE_FILL, SCORED_ZERO),
    ("hard_link_flood", HARD_LINK_FLOOD, SCORED_ZERO),
    ("sparse_files", SPARSE_FILES, SCORED_ZERO),
    ("output_flood", OUTPUT_FLOOD, SCORED_ZERO),
    ("close_every_fd", CLOSE_EVERY_FD, SCORED_ZERO),
    ("kill_everything", KILL_EVERYTHING, SCORED_ZERO),
    ("stop_itself", STOP_ITSELF, TIMED_OUT),
    ("spin_forever", SPIN, TIMED_OUT),
    ("sleep_past_the_timeout", SLEEP, TIMED_OUT),
    # The rlimit backend's kill and memory bound (issue 22): a vfork parent in D on its
    # stopped child, which a stop-then-kill never killed; memory spread over processes where
    # no process's RSS shows it (unmapped memfds, of an undumpable process too; AF_UNIX
    # socket buffers). (Heaps behind exited leaders: tests/sandbox/test_rlimit.py, rlimit
    # only; under bwrap's cgroup the grader overran its 5 s first.)
    ("stopped_vfork_pair", STOPPED_VFORK_PAIR, TIMED_OUT),
    ("memfds_over_processes", memory_spread(6, 206, "memfd"), OUT_OF_MEMORY),
    ("undumpable_memfds", memory_spread(6, 206, "hidden_memfd"), OUT_OF_MEMORY),
    ("socket_buffers", socket_buffers(8, 480), OUT_OF_MEMORY),
]

HOSTILE: list[Hostile] = [
    *(
        Hostile(
            f"import_{name}",
            "at-import",
            overrunning(ADD) if expect == TIMED_OUT else ADD,
            at_import(code),
            [],
            expect,
        )
        for name, code, expect in _PROGRAMS
    ),
    *(
        Hostile(
            f"agent_{name}",
            "agent-command",
            ADD,
            {"solution.py": CORRECT},
            [python(code)],
            SCORED_ONE,
        )
        for name, code, _ in _PROGRAMS
    ),
    # The honest side of the memory bound: 8 processes of memory_mb / 10 each fit, beside the
    # grader's own pytest (hence the room: its ~40 MiB counts too).
    Hostile(
        "import_eight_modest_processes",
        "at-import",
        ROOMY_ADD,
        at_import(processes_holding(8, ROOMY_MEMORY_MB // 10), CORRECT),
        [],
        SCORED_ONE,
    ),
]
