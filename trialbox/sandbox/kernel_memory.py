"""Kernel memory a slot's uids hold in SysV semaphore arrays and message queues, which no
process's RSS, no tmpfs file and no socket shows, and which outlive every process until the
wipe removes them. On the rlimit backend the IPC namespace is the worker's, so the objects are
told apart by uid: an object counts when its creator (`cuid`, fixed) or its owner (`uid`,
which IPC_SET may change) is one of the uids, as the wipe removes them (as_uid).

Every figure is an upper bound on what the kernel allocated, so a sandbox is never under-
counted; an honest program's few small objects cost it a few KiB:
- a semaphore array is one allocation of the array's header and one cache-line-aligned
  `struct sem` (64 bytes) per semaphore, rounded up by the allocator to a power of two
  (kmalloc caches, or the page allocator past 8 KiB): semget(IPC_PRIVATE, 32000) is 2 MiB;
- a message queue is its header, plus each message: a 48-byte header and its text in
  segments of at most a page, the last of which the allocator may round up to twice its size
  but never past a page.

Not counted here: SysV shared memory (the watchdog counts its pages where they are resident),
a process's SEM_UNDO records (per process and array; nothing in /proc shows them).
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import NamedTuple

SYSVIPC = Path("/proc/sysvipc")
SEM_SIZE = 64  # struct sem, ____cacheline_aligned_in_smp
SEM_ARRAY_HEADER = 384  # struct sem_array before its sems, with room to spare
MSG_QUEUE_HEADER = 512  # struct msg_queue, in the kmalloc cache it lands in
MSG_HEADER = 64  # struct msg_msg (48) and a segment's link, per message
PAGE = 4096
SMALLEST_ALLOCATION = 64
# A read of the tables costs what the machine's objects make it: WALK_IDLE times its CPU time
# passes before the next, so the reads take at most a fifth of a CPU (as the watchdog's walk).
WALK_IDLE = 4
SEM_INFO, MSG_INFO = 19, 12  # semctl / msgctl commands: the namespace's totals
SEMUSZ, SEMAEM = 7, 9  # in struct seminfo under SEM_INFO: arrays in use, semaphores in them


class _MsgInfo(ctypes.Structure):
    _fields_ = [
        ("msgpool", ctypes.c_int),  # under MSG_INFO: queues in use
        ("msgmap", ctypes.c_int),  # messages
        ("msgmax", ctypes.c_int),
        ("msgmnb", ctypes.c_int),
        ("msgmni", ctypes.c_int),
        ("msgssz", ctypes.c_int),
        ("msgtql", ctypes.c_int),  # bytes of text
        ("msgseg", ctypes.c_ushort),
    ]


class _Read(NamedTuple):
    totals: tuple[int, ...]  # the namespace's, when the tables were read
    held: int  # what the uids held then
    next_read: float  # monotonic time before which the tables are not read again


_libc = ctypes.CDLL(None, use_errno=True)
_reads: dict[tuple[int, ...], _Read] = {}
_reads_lock = threading.Lock()


def _allocated(size: int) -> int:
    """What the allocator hands out for `size` bytes: the next power of two, at least 64."""
    return max(SMALLEST_ALLOCATION, 1 << (size - 1).bit_length())


def semaphore_array_bytes(nsems: int) -> int:
    return _allocated(SEM_ARRAY_HEADER + nsems * SEM_SIZE)


def message_queue_bytes(cbytes: int, qnum: int) -> int:
    """A queue holding `qnum` messages of `cbytes` text bytes in all."""
    messages = cbytes + qnum * MSG_HEADER
    return MSG_QUEUE_HEADER + messages + min(messages, qnum * PAGE)


def _rows(text: str, columns: tuple[str, ...]) -> list[dict[str, int]]:
    """The rows of one /proc/sysvipc table, each as the named (integer) columns."""
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split()
    at = {name: header.index(name) for name in columns}
    rows = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) == len(header):
            rows.append({name: int(fields[index]) for name, index in at.items()})
    return rows


def semaphores(text: str, uids: tuple[int, ...]) -> int:
    """Bytes of the semaphore arrays in /proc/sysvipc/sem text that the uids created or own."""
    return sum(
        semaphore_array_bytes(row["nsems"])
        for row in _rows(text, ("nsems", "uid", "cuid"))
        if row["uid"] in uids or row["cuid"] in uids
    )


def message_queues(text: str, uids: tuple[int, ...]) -> int:
    """Bytes of the message queues in /proc/sysvipc/msg text that the uids created or own."""
    return sum(
        message_queue_bytes(row["cbytes"], row["qnum"])
        for row in _rows(text, ("cbytes", "qnum", "uid", "cuid"))
        if row["uid"] in uids or row["cuid"] in uids
    )


def _read(name: str) -> str:
    try:
        return (SYSVIPC / name).read_text()
    except OSError:  # a kernel without SysV IPC: nothing to hold
        return ""


def totals() -> tuple[int, ...]:
    """The IPC namespace's totals, O(1): (semaphore arrays, semaphores, message queues,
    messages, message bytes). () where the kernel has no SysV IPC."""
    seminfo = (ctypes.c_int * 10)()
    msginfo = _MsgInfo()
    if (
        _libc.semctl(0, 0, SEM_INFO, ctypes.byref(seminfo)) < 0
        or _libc.msgctl(0, MSG_INFO, ctypes.byref(msginfo)) < 0
    ):
        return ()
    return seminfo[SEMUSZ], seminfo[SEMAEM], msginfo.msgpool, msginfo.msgmap, msginfo.msgtql


def growth_bound(before: tuple[int, ...], after: tuple[int, ...]) -> int:
    """The most the namespace's objects can have grown by between two `totals`: each kind's
    increase, as if all of it were one uid's, its allocations rounded up to twice their size."""
    grown = (max(b - a, 0) for a, b in zip(before, after, strict=True))
    arrays, sems, queues, messages, text = grown
    return (
        2 * (arrays * SEM_ARRAY_HEADER + sems * SEM_SIZE)
        + queues * MSG_QUEUE_HEADER
        + 2 * (text + messages * MSG_HEADER)
    )


def held_by(uids: tuple[int, ...]) -> int:
    """Bytes of kernel memory the uids hold in SysV semaphore arrays and message queues.

    Cost per call: two syscalls (~10 us) for the namespace's totals, and nothing more when it
    holds no such object or its totals are those of this uids' last read of the tables (that
    answer stands). Otherwise the tables (/proc/sysvipc/sem and msg, a line per object of the
    machine) are read: ~0.2 ms with a few objects, ~200 ms at the kernel's cap of 32000 of
    each kind. A sandbox that keeps changing them cannot make every call pay that: the next
    read waits WALK_IDLE times the last one's CPU time, and until then the answer is the last
    read's plus all the namespace has grown by since (`growth_bound`: over-counted, never
    missed). (An object replaced by one of the same size under other uids leaves the totals
    unchanged: the answer is then off by what moved between two uid sets.)
    """
    now = totals()
    if not now or (now[0] == 0 and now[2] == 0):
        return 0
    with _reads_lock:
        last = _reads.get(uids)
    if last is not None and last.totals == now:
        return last.held
    if last is not None and time.monotonic() < last.next_read:
        return last.held + growth_bound(last.totals, now)
    started = time.thread_time()
    held = semaphores(_read("sem"), uids) + message_queues(_read("msg"), uids)
    cost = time.thread_time() - started
    with _reads_lock:
        _reads[uids] = _Read(now, held, time.monotonic() + cost * WALK_IDLE)
    return held
