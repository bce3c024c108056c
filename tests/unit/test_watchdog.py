"""The rlimit memory watchdog's parsing: which mounts are memory, and a socket's queued bytes."""

from __future__ import annotations

import struct
from pathlib import Path

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
