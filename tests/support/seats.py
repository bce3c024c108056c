"""Seats: how many tests run at once on this machine, across every pytest process.

xdist's workers, a second `make test` in another clone, a developer's pytest: each test takes a
seat for its whole protocol (setup, call, teardown) and waits while all are taken. Two suites
at once then share the machine's seats and each takes longer, instead of overloading the cores.
A test marked `alone` takes every seat: it asserts on results that wall-clock limits decide
(the demo's 5 s tasks, a memory hog's OOM before its timeout), which a loaded machine turns
into timeouts. Seats default to 2 per core (TRIALBOX_TEST_SEATS): most tests wait on
sandboxes, twins and state machines.

A seat is an flock, released when its holder dies. A test taking every seat first holds the
gate exclusively, so that no single seat is taken meanwhile; single seats are taken under the
gate shared, and never waited for while holding it, so the gate is free within moments.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from trialbox.sandbox.shared_files import try_exclusive

DIRECTORY = Path("/run/lock/trialbox-test-seats")  # tmpfs: gone with the machine's boot
POLL_S = 0.05


def count() -> int:
    return int(os.environ.get("TRIALBOX_TEST_SEATS") or 2 * (os.cpu_count() or 1))


def _open(path: Path) -> int:
    # Not inherited: a twin or worker started by the test must not keep the seat.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def seat(
    seats: int | None = None, directory: Path = DIRECTORY, alone: bool = False
) -> Iterator[list[int]]:
    """Hold one of `seats` seats (default: count()), or every one if `alone`, until the block
    ends; the seats' numbers."""
    seats = seats or count()
    directory.mkdir(parents=True, exist_ok=True)
    held: dict[int, int] = {}  # seat number -> its flock fd
    want = seats if alone else 1
    gate = _open(directory / "gate")
    try:
        # `alone` keeps the gate exclusive until it holds every seat; a single seat takes it
        # shared for one pass, so it never waits while holding it.
        while len(held) < want:
            fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            for number in set(range(seats)) - set(held):
                fd = try_exclusive(directory / str(number))
                if fd is not None:
                    held[number] = fd
                    if len(held) == want:
                        break
            if not alone or len(held) == want:
                fcntl.flock(gate, fcntl.LOCK_UN)
            if len(held) < want:
                time.sleep(POLL_S)
        yield sorted(held)
    finally:
        for fd in held.values():
            os.close(fd)
        os.close(gate)
