"""The rlimit memory watchdog's parsing: which mounts are memory, and a socket's queued bytes."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from trialbox.sandbox import watchdog
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
    dog._shmem_low = 0  # the machine's whole Shmem counts as grown: each sample wants a walk
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        dog._sample_kernel()
        time.sleep(watchdog.SAMPLE_S)
    elapsed = time.monotonic() - started
    assert len(walks) >= 1
    assert sum(walks) - walks[0] <= elapsed / (1 + watchdog.WALK_IDLE) + walks[0], walks
