"""kernel_memory: SysV semaphore arrays and message queues a set of uids holds, from
/proc/sysvipc text, and from the live kernel."""

from __future__ import annotations

import ctypes
import os
import time

from trialbox.sandbox import kernel_memory
from trialbox.sandbox.kernel_memory import (
    held_by,
    message_queue_bytes,
    message_queues,
    semaphore_array_bytes,
    semaphores,
)

MiB = 1024 * 1024

SEM = """\
       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
         0          1   600      32000  7000  7000  7000  7000          0 1796493164
         0          2   600          1     0     0  7001     0          0 1796493164
         0          3   600        250  7001  7001     0     0          0 1796493164
         0          4   600         10     0     0     0     0          0 1796493164
"""
MSG = """\
       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime
         0      65538   600       16000          2  2607     0  7000  7000  7000  7000 1796493164          0 1796493164
         0      65539   600           0          0     0     0     0     0  7001     0          0          0 1796493164
         0      65540   600         100        100  2607     0     0     0     0     0 1796493164          0 1796493164
"""  # noqa: E501


def test_a_semaphore_array_costs_its_allocation() -> None:
    assert semaphore_array_bytes(32000) == 2 * MiB  # as measured: 2 MiB of slab a call
    assert semaphore_array_bytes(1) == 512
    assert semaphore_array_bytes(250) == 16384


def test_semaphore_arrays_count_by_creator_or_owner() -> None:
    # id 1 by both; id 2 created by 7001 and given to root (IPC_SET); id 3 given to 7001.
    assert semaphores(SEM, (7000,)) == 2 * MiB
    assert semaphores(SEM, (7001,)) == semaphore_array_bytes(1) + semaphore_array_bytes(250)
    assert semaphores(SEM, (7000, 7001)) == 2 * MiB + 512 + 16384
    assert semaphores(SEM, (8000,)) == 0
    assert semaphores("", (7000,)) == 0


def test_a_message_queue_costs_its_text_headers_and_rounding() -> None:
    # Two 8000-byte messages: a page and a rounded-up segment each, under the bound.
    assert message_queue_bytes(16000, 2) == 512 + 16128 + 8192
    # 100 one-byte messages: 64 bytes each in the kernel's smallest cache.
    assert message_queue_bytes(100, 100) >= 100 * 64
    assert message_queue_bytes(0, 0) == 512


def test_message_queues_count_by_creator_or_owner() -> None:
    assert message_queues(MSG, (7000,)) == message_queue_bytes(16000, 2)
    assert message_queues(MSG, (7001,)) == message_queue_bytes(0, 0)
    assert message_queues(MSG, (9,)) == 0


def test_held_by_sees_what_this_process_creates_and_removes() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    me = (os.getuid(),)
    before = held_by(me)
    arrays = [libc.semget(0, 4000, 0o600) for _ in range(8)]  # IPC_PRIVATE
    queue = libc.msgget(0, 0o600)
    try:
        assert min(arrays) >= 0 and queue >= 0, ctypes.get_errno()
        message = ctypes.create_string_buffer(8 + 4000)
        ctypes.c_long.from_buffer(message).value = 1
        assert libc.msgsnd(queue, message, 4000, 0o4000) == 0  # IPC_NOWAIT
        expected = 8 * semaphore_array_bytes(4000) + message_queue_bytes(4000, 1)
        assert held_by(me) - before >= expected  # read now, or bounded from the totals
        time.sleep(0.1)  # past the pause after the last read of the tables
        assert held_by(me) - before == expected
        assert held_by(me) - before == expected  # the answer for unchanged totals stands
    finally:
        for array in arrays:
            libc.semctl(array, 0, 0)  # IPC_RMID
        libc.msgctl(queue, 0, None)
    time.sleep(0.1)
    assert held_by(me) == before


def test_growth_between_reads_is_bounded_from_the_totals() -> None:
    before = (1, 1, 0, 0, 0)
    # One more array of 250 (16 KiB as allocated), one queue with two 8000-byte messages.
    after = (2, 251, 1, 2, 16000)
    bound = kernel_memory.growth_bound(before, after)
    assert bound >= semaphore_array_bytes(250) + message_queue_bytes(16000, 2)
    assert bound == 2 * (384 + 250 * 64) + 512 + 2 * (16000 + 2 * 64)
    assert kernel_memory.growth_bound(after, before) == 0  # removals free, never charge


def test_totals_follow_the_namespace() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    before = kernel_memory.totals()
    array = libc.semget(0, 3, 0o600)
    try:
        after = kernel_memory.totals()
        assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
    finally:
        libc.semctl(array, 0, 0)
