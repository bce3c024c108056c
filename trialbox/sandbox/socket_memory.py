"""Kernel memory queued in AF_UNIX sockets, by owner uid, from the kernel's sock_diag netlink
interface (what `ss -xm` shows). The seccomp filter leaves AF_UNIX open (asyncio and
multiprocessing need socketpair); a datagram pair holds ~360 KiB of buffers no process's RSS
shows, so 8 processes of 480 pairs held 1.4 GiB. Only sockets of this network namespace are
seen: the rlimit backend's sandboxes share the worker's.
"""

from __future__ import annotations

import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_MEMINFO, UDIAG_SHOW_UID = 0x20, 0x40
UNIX_DIAG_MEMINFO, UNIX_DIAG_UID = 5, 7
SK_MEMINFO_RMEM_ALLOC, SK_MEMINFO_WMEM_ALLOC = 0, 2
NLMSG_HEADER = struct.Struct("=IHHII")
UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")
UNIX_DIAG_MSG_SIZE = 16
RTATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def _request() -> bytes:
    body = UNIX_DIAG_REQ.pack(
        socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_MEMINFO | UDIAG_SHOW_UID, 0, 0
    )
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, flags, 1, 0) + body


def _socket_bytes(attrs: bytes) -> tuple[int | None, int]:
    """(owner uid, queued bytes) from one socket's attributes."""
    uid, queued, at = None, 0, 0
    while at + RTATTR.size <= len(attrs):
        length, kind = RTATTR.unpack_from(attrs, at)
        if length < RTATTR.size:
            break
        payload = attrs[at + RTATTR.size : at + length]
        if kind == UNIX_DIAG_UID and len(payload) >= 4:
            uid = struct.unpack_from("=I", payload)[0]
        elif kind == UNIX_DIAG_MEMINFO and len(payload) >= 12:
            meminfo = struct.unpack_from("=3I", payload)
            queued = meminfo[SK_MEMINFO_RMEM_ALLOC] + meminfo[SK_MEMINFO_WMEM_ALLOC]
        at += _align(length)
    return uid, queued


class UnixSocketMemory:
    """One netlink socket, reused by every `queued` call of a watchdog."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)

    def close(self) -> None:
        self._sock.close()

    def queued(self, uids: tuple[int, ...]) -> int:
        """Bytes queued in (charged to) every AF_UNIX socket the uids own."""
        self._sock.send(_request())
        total = 0
        while True:
            data = self._sock.recv(1 << 16)
            at = 0
            while at + NLMSG_HEADER.size <= len(data):
                length, kind = NLMSG_HEADER.unpack_from(data, at)[:2]
                if kind == NLMSG_DONE:
                    return total
                if kind == NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, at + NLMSG_HEADER.size)
                    raise OSError(-errno, "sock_diag refused the AF_UNIX dump")
                start = at + NLMSG_HEADER.size + UNIX_DIAG_MSG_SIZE
                uid, queued = _socket_bytes(data[start : at + length])
                if uid in uids:
                    total += queued
                at += _align(length)
