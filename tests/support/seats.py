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

Holding the gate idles every other worker until the last seat is free, so a test alone first
waits without it: each holder writes in its seat's file when it expects to end (its last
recorded time, tests/support/schedule.py), and the test alone takes the gate once every held
seat is expected to end within SOON_S (or after PATIENCE_S). A module's 4-minute fixture no
longer holds the whole machine idle behind a 10-second test alone (a fresh run's workers stood
idle 11 % of it, in drains of 17-65 s).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trialbox.sandbox.shared_files import try_exclusive

DIRECTORY = Path("/run/lock/trialbox-test-seats")  # tmpfs: gone with the machine's boot
POLL_S = 0.05
SOON_S = 20.0  # a test alone takes the gate once every held seat should be free within this
PATIENCE_S = 900.0  # ... or after this long: an expectation that was wrong never starves it


def count() -> int:
    return int(os.environ.get("TRIALBOX_TEST_SEATS") or 2 * (os.cpu_count() or 1))


def _open(path: Path) -> int:
    # Not inherited: a twin or worker started by the test must not keep the seat.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _expected_end(directory: Path, number: int) -> float | None:
    """When the holder of seat `number` expects to end (epoch s), or None when it is free."""
    fd = try_exclusive(directory / str(number))
    if fd is not None:
        os.close(fd)
        return None
    with contextlib.suppress(OSError, ValueError):
        return float((directory / str(number)).read_text())
    return 0.0  # its holder has not written yet: it just started, with no expectation


def _wait_for_ends(seats: int, directory: Path) -> None:
    """Until every held seat is expected to be free within SOON_S, or PATIENCE_S passed."""
    give_up = time.monotonic() + PATIENCE_S
    while time.monotonic() < give_up:
        ends = [_expected_end(directory, number) for number in range(seats)]
        if max((end for end in ends if end is not None), default=0.0) - time.time() <= SOON_S:
            return
        time.sleep(1.0)


@contextlib.contextmanager
def seat(
    seats: int | None = None,
    directory: Path = DIRECTORY,
    alone: bool = False,
    expected_s: float = 0.0,
) -> Iterator[list[int]]:
    """Hold one of `seats` seats (default: count()), or every one if `alone`, until the block
    ends; the seats' numbers. `expected_s`: how long the holder expects to hold it."""
    seats = seats or count()
    directory.mkdir(parents=True, exist_ok=True)
    held: dict[int, int] = {}  # seat number -> its flock fd
    want = seats if alone else 1
    if alone:
        _wait_for_ends(seats, directory)
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
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(time.time() + expected_s).encode(), 0)
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


class InARow:
    """Every seat, held from the first of several tests marked `alone` that run one after the
    other to the last of them: the machine's seats drain once for them, not once each."""

    def __init__(self, seats: int | None = None, directory: Path = DIRECTORY) -> None:
        self.seats, self.directory = seats, directory
        self._held: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def alone(self, last: Callable[[], bool], expected_s: float = 0.0) -> Iterator[None]:
        """One test alone. `last`, asked once it ended: no test alone follows it (the next
        is not alone, or the session stops), and every seat is given back; an interruption
        gives them back too."""
        if self._held is None:
            held = contextlib.ExitStack()
            held.enter_context(seat(self.seats, self.directory, True, expected_s))
            self._held = held
        ended = False
        try:
            yield
            ended = True
        finally:
            if not ended or last():
                self._held.close()
                self._held = None
