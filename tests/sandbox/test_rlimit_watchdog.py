"""What the rlimit watchdog (trialbox/sandbox/watchdog.py) charges a sandbox, on real processes
of a uid no runner uses: what its processes hold, wherever they keep it, and never a
neighbour's shared memory."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from trialbox.sandbox import watchdog
from trialbox.sandbox.watchdog import tmpfs_places

UID = 2**31 - 9  # no runner's: its processes are this test's alone
MiB = 1 << 20
# A memfd of 64 MiB held by a thread; then "ready". `{setup}` runs in that thread first.
HOLDER = """
import os, threading, time
def hold():
{setup}
    fd = os.memfd_create("held")
    for _ in range(64):
        os.write(fd, b"x" * (1 << 20))
    print("ready", flush=True)
    time.sleep(60)
threading.Thread(target=hold).start()
{after}
"""


@contextlib.contextmanager
def running(code: str) -> Iterator[subprocess.Popen[str]]:
    """`code` run by the system's python as UID until the block ends, once it prints "ready"."""
    argv = ["/usr/bin/python3", "-c", code]
    proc = subprocess.Popen(argv, user=UID, group=UID, cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _zombies(uid: int) -> list[int]:
    found = []
    for pid in watchdog._pids((uid,)):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                found.append(pid)
    return found


def test_an_exited_child_beside_a_neighbours_shared_memory_is_not_hiding() -> None:
    """Was a flake of a loaded suite: a child that exited and is not yet waited for (an honest
    program has them at every end: `subprocess.run`, a pool's workers) shows its descriptors
    as root's, as an undumpable process does; the walk took it for one that hid and charged the
    sandbox all the machine's shared-memory growth, a neighbour's /dev/shm file included: an
    honest sandbox `oom`. A thread without memory (exiting, a zombie) holds nothing of its
    own."""
    code = "import os, time\nif os.fork() == 0:\n    os._exit(0)\nprint('ready', flush=True)\n"
    code += "time.sleep(60)\n"
    neighbour = Path(f"/dev/shm/trialbox-test-neighbour-{os.getpid()}")
    places = tmpfs_places(Path("/proc/self/mountinfo").read_text())
    with running(code):
        deadline = time.monotonic() + 10
        while not _zombies(UID):
            assert time.monotonic() < deadline, "no zombie"
            time.sleep(0.01)
        dog = watchdog.MemoryWatchdog((UID,), 100, places)
        try:
            neighbour.write_bytes(b"y" * (150 * MiB))  # root's: never the sandbox's
            dog._sample_processes()
            total = dog._sample_kernel()  # the machine grew past the limit: a walk
        finally:
            neighbour.unlink()
    assert total < 50 * MiB, f"{total / MiB:.0f} MiB charged"  # an interpreter's few MiB


def test_memfds_of_a_thread_with_a_descriptor_table_of_its_own_are_counted() -> None:
    """Was a hole (found with the flake above): the walk listed /proc/<pid>/fd, the leader's
    table, and a thread that made a table of its own (unshare(CLONE_FILES), which the seccomp
    filter allows) held memfds no walk saw. Every table of every thread is looked at."""
    setup = "    import ctypes\n    assert ctypes.CDLL(None).unshare(0x400) == 0  # CLONE_FILES"
    with running(HOLDER.format(setup=setup, after="")):
        found = watchdog._unmapped_files((UID,), watchdog._pids((UID,)), [], 0)
    assert found >= 64 * MiB, f"{found / MiB:.0f} MiB found"


def test_memfds_of_a_leader_that_exited_alone_are_counted() -> None:
    """A leader that exited alone (its threads run on) shows its descriptors as root's: not
    hiding, and its live threads hold the group's table, which is looked at."""
    after = "import ctypes, platform\nctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}"
    after += "[platform.machine()], 0)  # SYS_exit: this thread alone\n"
    with running(HOLDER.format(setup="    pass", after=after)):
        found = watchdog._unmapped_files((UID,), watchdog._pids((UID,)), [], 0)
    assert found >= 64 * MiB, f"{found / MiB:.0f} MiB found"
