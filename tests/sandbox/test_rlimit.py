"""The rlimit backend (what runs inside Fargate): the hostile cases it does cover.

Not covered, by design (see trialbox/sandbox/rlimit.py): a private /tmp, hidden host
processes, loopback/network isolation, a per-workspace disk cap and a cgroup OOM signal.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from tests.support.programs import FORK_BOMB, LEFTOVERS, SETSID_DAEMON
from tests.support.sandbox import secret_in_another_slot
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Limits, Sample, Status, Task
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.processes import processes_of
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


@pytest.fixture(scope="module")
def rlimit() -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "rlimit"}))


def uids(runner: Runner) -> tuple[int, ...]:
    base = runner.config.uid_base
    return tuple(range(base, base + 2 * runner.config.slots))


def test_timeout_kills_the_whole_session(rlimit: Runner) -> None:
    result = rlimit.exec(["python", "-c", "while True: pass"], Limits(timeout_s=1))
    assert (result.status, result.timed_out, result.signal) == (Status.TIMEOUT, True, "SIGKILL")
    assert result.wall_s < 3


def test_setsid_daemon_is_killed_by_kill_minus_one(rlimit: Runner) -> None:
    code = SETSID_DAEMON
    result = rlimit.exec(["python", "-c", code], Limits())
    assert result.stdout == "parent done\n"
    assert processes_of(uids(rlimit)) == []


def test_fork_bomb_hits_nproc(rlimit: Runner) -> None:
    code = FORK_BOMB
    result = rlimit.exec(["python", "-c", code], Limits(pids=32))
    forked, errno = map(int, result.stdout.split())
    assert errno == 11 and forked < 32
    assert processes_of(uids(rlimit)) == []


def test_memory_limit_makes_allocation_fail(rlimit: Runner) -> None:
    result = rlimit.exec(
        ["python", "-c", "x = bytearray(600 * 1024 * 1024)"], Limits(memory_mb=256)
    )
    assert result.exit_code == 1 and "MemoryError" in result.stderr
    assert result.oom_killed is False  # no cgroup: documented gap


def test_file_size_limit_gives_efbig(rlimit: Runner) -> None:
    code = (
        "try:\n"
        "    open('big', 'wb').write(b'x' * (20 * 1024 * 1024))\n"
        "except OSError as e:\n"
        "    print(e.errno)\n"
    )
    result = rlimit.exec(["python", "-c", code], Limits(disk_mb=8, memory_mb=256))
    assert result.stdout == "27\n"  # EFBIG: RLIMIT_FSIZE caps each file


def test_environment_is_explicit_and_uid_unprivileged(
    rlimit: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "must-not-leak")
    code = (
        "import os\n"
        "print(os.getuid(), sorted(k for k in os.environ if k.startswith('AWS')))\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
    )
    first, caps = rlimit.exec(["python", "-c", code], Limits()).stdout.splitlines()
    uid, aws = first.split(" ", 1)
    assert int(uid) in uids(rlimit) and aws == "[]"
    assert caps == "0000000000000000"


def test_other_slots_workspace_is_unreadable(rlimit: Runner) -> None:
    with secret_in_another_slot(rlimit) as path:
        code = (
            f"try:\n    open({str(path)!r}).read()\n"
            "except OSError as e:\n    print(type(e).__name__)"
        )
        result = rlimit.exec(["python", "-c", code], Limits())
    assert result.stdout == "PermissionError\n"


def test_grading_works_under_rlimit(rlimit: Runner) -> None:
    task = Task.model_validate(ADD_TASK)
    files = {"solution.py": CORRECT, "conftest.py": "import os\nos._exit(0)\n"}
    report = rlimit.run(task, Sample(task_id=task.task_id, sample_id="r", files=files))
    result = score(task.grading, report)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)
    assert report.provenance is not None and report.provenance.backend == "rlimit"


def test_the_runner_environment_block_is_scrubbed(rlimit: Runner) -> None:
    # What /proc/<pid>/environ shows of this process, and every child it forks before exec.
    assert Path("/proc/self/environ").read_bytes().strip(b"\0") == b""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    assert libc.getenv(b"PATH") == os.environ["PATH"].encode()  # C code still sees it


def test_nothing_a_job_leaves_survives_the_wipe(rlimit: Runner) -> None:
    result = rlimit.exec(["python", "-c", LEFTOVERS], Limits())
    # No key of any keyring: the seccomp filter refuses add_key and keyctl (EPERM).
    made = ["/tmp", "/var/tmp", "/dev/shm", "shm", "sem", "msg"]
    assert result.stdout.split() == made
    assert rlimit.residue() == []
    # What any of this runner's uids still owns (its uids are no other runner's).
    mine = set(uids(rlimit))
    files = [
        p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).glob("trialbox-leftover*")
    ]
    assert [p for p in files if p.lstat().st_uid in mine] == []
    for kind in ("shm", "sem", "msg"):
        header, *rows = [
            line.split() for line in Path("/proc/sysvipc", kind).read_text().splitlines()
        ]
        assert [r for r in rows if int(r[header.index("uid")]) in mine] == [], kind
    probe = (
        "import ctypes, platform\n"
        "keyctl = {'x86_64': 250, 'aarch64': 219}[platform.machine()]\n"
        "libc = ctypes.CDLL(None)\n"
        "print(libc.syscall(keyctl, 11, -4, 0, 0),"
        " libc.syscall(keyctl, 11, libc.syscall(keyctl, 22, -1, -2), 0, 0))\n"
    )
    again = rlimit.exec(["python", "-c", probe], Limits())
    assert again.stdout == "-1 -1\n"  # keyctl itself is refused


def test_residue_names_what_a_job_left(rlimit: Runner) -> None:
    # Planted by the root test process as a slot uid would: the check must see it.
    uid = rlimit.slots.slot(0).agent_uid
    path = Path("/dev/shm") / f"planted-{uid}"
    path.write_text("x")
    os.chown(path, uid, uid)
    rlimit.slots.used.add(0)  # as a job in it would
    try:
        assert rlimit.residue() == [f"file {path}"]
    finally:
        path.unlink()
