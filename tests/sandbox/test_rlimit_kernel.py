"""Kernel memory no process's RSS shows, on the host rlimit backend (and the seccomp filter both
backends share): what is refused at the source, what kernel_memory counts, and processes that
outlive their SIGKILL in an uninterruptible sleep (dying: the run's outcome stands, the slot
waits for them)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from tests.support.tasks import ADD_TASK
from trialbox.models import Limits, Sample, Status, Task
from trialbox.sandbox import kernel_memory, processes
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score


@pytest.fixture(scope="module")
def rlimit() -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": "rlimit"}))


def uids(runner: Runner) -> tuple[int, ...]:
    base = runner.config.uid_base
    return tuple(range(base, base + 2 * runner.config.slots))


REFUSED = r"""
import ctypes, errno, socket
out = []
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    out.append("netlink opened")
except OSError as e:
    out.append("netlink " + errno.errorcode[e.errno])
found = socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG)
out.append("getaddrinfo " + ("ok" if found else "none"))
libc = ctypes.CDLL(None, use_errno=True)
for nsems in (32000, 251, -1, 250):
    made = libc.semget(0, nsems, 0o600)
    out.append(f"semget {nsems} " + ("ok" if made >= 0 else errno.errorcode[ctypes.get_errno()]))
    if made >= 0:
        libc.semctl(made, 0, 0)
print("; ".join(out))
"""


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_netlink_and_large_semaphore_arrays_are_refused(backend: str) -> None:
    """Was a break (red team 3, 4): semget(IPC_PRIVATE, 32000) is 2 MiB of slab a call, and
    900 netlink sockets held 1.1 GiB of echoed acks; both were allowed. glibc's look-ups
    still work without netlink."""
    runner = Runner(SandboxConfig.from_env().model_copy(update={"backend": backend}))
    result = runner.exec(["python", "-c", REFUSED], Limits())
    assert result.stdout.strip() == (
        "netlink EAFNOSUPPORT; getaddrinfo ok; semget 32000 EINVAL; semget 251 EINVAL; "
        "semget -1 EINVAL; semget 250 ok"
    ), result.stderr


HOLD_IPC = r"""
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
message = ctypes.create_string_buffer(8 + 8000)
ctypes.c_long.from_buffer(message).value = 1
for _ in range(40):
    assert libc.semget(0, 250, 0o600) >= 0
for _ in range(20):
    queue = libc.msgget(0, 0o600)
    for _ in range(2):
        assert libc.msgsnd(queue, message, 8000, 0o4000) == 0
print("held", flush=True)
time.sleep(2)
"""


def test_a_sandboxs_semaphores_and_message_queues_are_counted(rlimit: Runner) -> None:
    """Was a break (red team 3, 4): 4 GiB of semaphore arrays and 510 MiB of message queues
    under a 256 MiB limit, counted nowhere. kernel_memory.held_by sees each byte of them."""
    expected = 40 * kernel_memory.semaphore_array_bytes(250) + 20 * (
        kernel_memory.message_queue_bytes(16000, 2)
    )
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(kernel_memory.held_by(uids(rlimit)))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = rlimit.exec(["python", "-c", HOLD_IPC], Limits(timeout_s=10))
    finally:
        done.set()
        sampler.join()
    assert (result.status, result.stdout) == (Status.SUCCEEDED, "held\n"), result.stderr
    assert expected in seen  # read from the tables while the program held them
    assert max(seen) <= 3 * expected  # over-counted between two reads, and bounded
    assert kernel_memory.held_by(uids(rlimit)) == 0  # the wipe removed them


# Dirty pages scattered over 4 workspace files, then fsync(2) loops in new sessions: fsync
# sleeps uninterruptibly until the file's writeback is done (~0.3 s here), SIGKILL or not.
DIRTY_THEN_FSYNC = r"""
import os, time
page = b"\1" * 4096
for i in range(4):
    fd = os.open(f"blob{i}", os.O_WRONLY | os.O_CREAT, 0o600)
    for offset in range(0, 32 << 20, 8192):
        os.pwrite(fd, page, offset)
    if os.fork() == 0:
        os.setsid()
        while True:
            os.fsync(fd)
    os.close(fd)
time.sleep(0.05)
"""


def test_processes_dying_in_an_uninterruptible_sleep_never_mask_the_outcome(
    rlimit: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break (red team 9): sync(2) loops in D outlived the kill's wait, and a wrong
    solution's run was a sandbox_error, loss-masked. The kill's wait is shortened here so that
    a fraction of a second of writeback outlasts it, as gigabytes outlast 5 s."""
    monkeypatch.setattr(processes, "WAIT_GONE_S", 0.05)
    raw: dict[str, Any] = json.loads(json.dumps(ADD_TASK))
    raw["limits"] = raw["limits"] | {"timeout_s": 20, "disk_mb": 64}
    task = Task.model_validate(raw)
    wrong = "def add(a, b):\n    return a - b\n"
    sample = Sample(
        task_id=task.task_id,
        sample_id="s",
        files={"solution.py": wrong},
        commands=[["python", "-c", DIRTY_THEN_FSYNC]],
    )
    report = rlimit.run(task, sample)
    result = score(task.grading, report)
    assert (result.status, result.reward, result.loss_mask) == (Status.SUCCEEDED, 0.0, False), (
        report.error
    )
    # The slot waits for them: once they are gone it is swept and clean.
    deadline = time.monotonic() + 120
    while processes.processes_of(uids(rlimit)) or any(
        (rlimit.slots.locks_dir / f"{i}.dirty").exists() for i in range(rlimit.config.slots)
    ):
        assert time.monotonic() < deadline, processes.processes_of(uids(rlimit))
        time.sleep(0.1)
    time.sleep(0.2)  # the quarantine thread closes the slot's lock after the marker
    assert rlimit.residue() == []
    again = rlimit.exec(["python", "-c", "print('next')"], Limits())
    assert (again.status, again.stdout) == (Status.SUCCEEDED, "next\n")
