"""Seats: how many tests run at once on this machine, across every pytest process.

xdist's workers, a second `make test` in another clone, a developer's pytest: each test takes a
seat for its whole protocol (setup, call, teardown) and waits while all are taken. Two suites
at once then share the machine's seats and each takes longer, instead of overloading 2 cores
until wall-clock limits (a 1 s timeout, the demo's 5 s task) turn honest results into
timeouts. A seat is an flock, released when its holder dies. Seats default to 2 per core
(TRIALBOX_TEST_SEATS): most tests wait on sandboxes, twins and state machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

DIRECTORY = Path("/run/lock/trialbox-test-seats")  # tmpfs: gone with the machine's boot
POLL_S = 0.05


def count() -> int:
    return int(os.environ.get("TRIALBOX_TEST_SEATS") or 2 * (os.cpu_count() or 1))


@contextlib.contextmanager
def seat(seats: int | None = None, directory: Path = DIRECTORY) -> Iterator[int]:
    """Hold one of `seats` seats (default: count()) until the block ends; its number."""
    seats = seats or count()
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for number in range(seats):
            # Not inherited: a twin or worker started by the test must not keep the seat.
            fd = os.open(directory / str(number), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield number
            finally:
                os.close(fd)
            return
        time.sleep(POLL_S)
