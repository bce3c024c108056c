"""The rlimit memory watchdog's parsing: which mounts are memory, and a socket's queued bytes."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from trialbox.sandbox import kernel_memory, processes, watchdog
from trialbox.sandbox.socket_memory import UNIX_DIAG_MEMINFO, UNIX_DIAG_UID, _socket_bytes
from trialbox.sandbox.watchdog import tmpfs_places

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=65536k
26 24 0:24 / /scratch\\040space rw,relatime - tmpfs tmpfs rw
27 1 254:0 / / ro,relatime - ext4 /dev/vda rw
28 27 0:25 / /opt/ro ro,nosuid - tmpfs tmpfs ro,size=4k
29 27 254:1 / /tmp rw,relatime - ext4 /dev/vdb rw
"""


def test_tmpfs_places_are_the_writable_tmpfs_mounts() -> None:
    assert tmpfs_places(MOUNTINFO) == [Path("/dev/shm"), Path("/scratch space")]


def _attr(kind: int, payload: bytes) -> bytes:
    padding = b"\0" * (-len(payload) % 4)
    return struct.pack("=HH", 4 + len(payload), kind) + payload + padding


def test_a_sockets_queued_bytes_are_its_receive_and_send_allocations() -> None:
    meminfo = struct.pack("=9I", 100, 0, 2000, 0, 0, 0, 0, 0, 0)  # rmem_alloc, .., wmem_alloc
    attrs = (
        _attr(6, b"\x00")
        + _attr(UNIX_DIAG_MEMINFO, meminfo)
        + _attr(UNIX_DIAG_UID, b"\x39\x05\0\0")
    )
    assert _socket_bytes(attrs) == (1337, 2100)
    assert _socket_bytes(_attr(6, b"\x00")) == (None, 0)  # a kernel that sends neither


def test_the_tmpfs_walk_takes_at_most_a_share_of_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: while the machine's shared memory had grown past what was left of the
    limit, every sample (each 2 ms) walked every tmpfs file: a grader that made 8,000 files
    lost its CPU to the walks and timed out. A walk now waits WALK_IDLE times its cost."""
    for i in range(4000):
        (tmp_path / str(i)).touch()
    walks: list[float] = []
    real_walk = watchdog._unmapped_files

    def counted(*args: Any) -> int:
        started = time.thread_time()
        try:
            return real_walk(*args)
        finally:
            walks.append(time.thread_time() - started)

    monkeypatch.setattr(watchdog, "_unmapped_files", counted)
    dog = watchdog.MemoryWatchdog((os.getuid(),), 1, [tmp_path])
    dog._grown = 1 << 40  # as if the machine's shared memory had grown: the first sample walks
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        dog._sample_kernel()
        time.sleep(watchdog.SAMPLE_S)
    elapsed = time.monotonic() - started
    assert len(walks) >= 1
    assert sum(walks) - walks[0] <= elapsed / (1 + watchdog.WALK_IDLE) + walks[0], walks


STATUS = (
    b"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\n"
    b"VmRSS:\t  300000 kB\nRssAnon:\t  200000 kB\nRssFile:\t   10000 kB\nRssShmem:\t      24 kB\n"
)


@pytest.mark.parametrize("name", [b"RssAnon:0", b"RssAnon:x", b"RssAnon:-999999", b"RssShmem:9"])
def test_a_process_name_never_changes_its_counted_memory(name: bytes) -> None:
    """Was a break (red team 22, a9): the first line of /proc/<pid>/status is the name a
    process gives itself, and the figures were found by searching the whole text: a name of
    `RssAnon:0` hid 1.6 GiB, `RssAnon:x` raised (and the sampling thread died), and
    `RssAnon:-999999` counted -976 MiB. Only the kernel's own lines are read."""
    status = STATUS.replace(b"{name}", name)
    assert watchdog._rss_fields(status) == (200000 + 24) * 1024


def test_a_figure_that_is_not_a_count_is_refused() -> None:
    with pytest.raises(ValueError):
        watchdog._rss_fields(STATUS.replace(b"200000", b"-200000").replace(b"{name}", b"p"))


def test_a_sample_that_fails_kills_the_sandbox_rather_than_stop_watching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (a9): an exception in a sample ended its thread, and the sandbox was
    watched no more. Now a sample that cannot be taken counts as over the limit."""

    def broken(uids: tuple[int, ...]) -> list[int]:
        raise ValueError("unreadable")

    monkeypatch.setattr(watchdog, "_pids", broken)
    dog = watchdog.MemoryWatchdog((2**31 - 7,), 1024, [])
    dog.start()
    deadline = time.monotonic() + 2
    while not dog.exceeded and time.monotonic() < deadline:
        time.sleep(0.01)
    dog.stop()
    assert dog.exceeded


def test_a_stale_pid_list_never_kills_a_process_of_another_uid() -> None:
    """Was a break (a11): the kill signalled the pids of the last sample, which the kernel
    may have handed to other processes since (root's, another slot's). A process is signalled
    only when it is one of the slot's uids at the moment of signalling."""
    victim = subprocess.Popen(["sleep", "30"])
    try:
        dog = watchdog.MemoryWatchdog((2**31 - 7,), 1024, [])
        dog._pids = [victim.pid]  # a frozen sample: the pid is now another's
        dog._over()
        time.sleep(0.1)
        assert victim.poll() is None
        processes._signal([victim.pid], (2**31 - 7,), signal.SIGKILL)
        time.sleep(0.1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_kernel_memory_the_uids_hold_in_sysv_objects_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (red team 22, a1/a2): semaphore arrays and message queues no RSS shows
    held 4 GiB under 256 MiB. kernel_memory.held_by is part of the kernel-side sample."""
    asked: list[tuple[int, ...]] = []

    def held_by(uids: tuple[int, ...]) -> int:
        asked.append(uids)
        return 3 << 20

    monkeypatch.setattr(kernel_memory, "held_by", held_by)
    uids = (2**31 - 7,)
    dog = watchdog.MemoryWatchdog(uids, 1024, [])
    assert dog._sample_kernel() >= 3 << 20
    assert asked == [uids]


def test_tmpfs_entries_that_are_not_files_are_counted() -> None:
    """Was a break (red team 22, a7): 250,000 symlinks with long targets held 977 MiB of
    tmpfs pages (and 234 MiB of inodes) under 256 MiB; the walk counted regular files only.
    Every entry the uids own counts: its pages and its inode."""
    place = Path(f"/dev/shm/trialbox-test-entries-{os.getpid()}")
    place.mkdir()
    try:
        for i in range(200):
            (place / f"link{i}").symlink_to("x" * 4000 + str(i))
            (place / f"dir{i}").mkdir()
            (place / f"empty{i}").touch()
        counted = watchdog._unmapped_files((os.getuid(),), [], [place], 0)
        assert counted >= 200 * 4096 + 600 * watchdog.ENTRY_BYTES
    finally:
        subprocess.run(["rm", "-rf", str(place)], check=True)


def test_shared_memory_grown_since_the_last_walk_counts_until_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (red team 22, a5): 200,000 empty files made each walk of the tmpfs slow,
    and the walks wait a multiple of their cost: memfds grew to 3 GiB under 256 MiB unseen in
    between. The machine's shared memory grown since the last walk began now counts as the
    sandbox's until the next walk says whose it is."""
    machine = {"shmem": 0}
    monkeypatch.setattr(watchdog, "_shmem", lambda: machine["shmem"])
    monkeypatch.setattr(watchdog, "_slab", lambda: 0)
    monkeypatch.setattr(watchdog, "_unmapped_files", lambda *args: 0)  # nothing of its own
    monkeypatch.setattr(watchdog, "WALK_IDLE", 10**9)  # a walk that cost anything: no next
    dog = watchdog.MemoryWatchdog((2**31 - 7,), 100, [])
    machine["shmem"] = 150 << 20  # another's: a walk finds nothing of the sandbox's
    assert dog._sample_kernel() < 100 << 20
    dog._next_walk = time.monotonic() + 3600  # the walk is slow: the next one is far
    machine["shmem"] = 400 << 20  # grown since the walk, and no walk looks
    assert dog._sample_kernel() > 100 << 20
    assert dog._total() > 100 << 20  # the processes' thread sees it too


def _machine(monkeypatch: pytest.MonkeyPatch, shmem_mb: int = 0) -> dict[str, int]:
    """The machine's Shmem as the test sets it (slab still)."""
    machine = {"shmem": shmem_mb << 20}
    monkeypatch.setattr(watchdog, "_shmem", lambda: machine["shmem"])
    monkeypatch.setattr(watchdog, "_slab", lambda: 0)
    return machine


def test_a_neighbours_growth_after_a_cheap_walk_is_not_the_sandboxs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a flake of a loaded suite: all the machine's Shmem grown since a walk began counted
    as the sandbox's until the next walk, in both threads, however cheap the walks: a
    neighbour's 300 MiB burst into /dev/shm put a sandbox holding 60 of its 100 MiB over
    (`oom`). Only while a walk must wait (the sandbox made it slow) does that growth count."""
    machine = _machine(monkeypatch)
    monkeypatch.setattr(watchdog, "_unmapped_files", lambda *args: 0)  # nothing of its own
    dog = watchdog.MemoryWatchdog((2**31 - 7,), 100, [])
    dog._processes = 60 << 20
    machine["shmem"] = 50 << 20
    assert dog._sample_kernel() == 60 << 20  # it could be over: a walk, which finds nothing
    machine["shmem"] = 350 << 20  # a neighbour's burst, before the next kernel sample
    assert dog._total() == 60 << 20  # the processes' thread
    assert dog._sample_kernel() == 60 << 20  # the next walk finds nothing either


@pytest.mark.parametrize("held", ["files", "hidden"])
def test_a_neighbours_release_hides_none_of_the_sandboxs_growth(
    monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """Was a flake of a loaded suite (an undumpable sandbox held 552 MiB of memfds under 256
    before its `oom`): a walk was wanted only once the machine's Shmem passed a low-water mark
    by what was left of the limit, and a neighbour freeing 300 MiB while the sandbox wrote
    lowered that mark under the sandbox's own growth. What the machine's Shmem rises by now
    counts, whatever others freed meanwhile; a process that hid is charged all of it."""
    machine = _machine(monkeypatch, shmem_mb=300)  # a neighbour's 300 MiB
    own = {"bytes": 0}

    def walk(uids: tuple[int, ...], pids: list[int], places: list[Path], risen: int) -> int:
        return own["bytes"] if held == "files" else risen

    monkeypatch.setattr(watchdog, "_unmapped_files", walk)
    dog = watchdog.MemoryWatchdog((2**31 - 7,), 80, [])
    # The sandbox writes 200 MiB in three samples; meanwhile the neighbour frees its 300.
    for shmem, mine in ((350, 50), (250, 150), (300, 200)):
        machine["shmem"], own["bytes"] = shmem << 20, mine << 20
        total = dog._sample_kernel()
    assert total == {"files": 200 << 20, "hidden": 100 << 20}[held]  # either way over 80
