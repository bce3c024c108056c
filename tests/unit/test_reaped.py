"""Reaped.exited(within) (trialbox/sandbox/reaper.py) near a deadline."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from trialbox.sandbox import reaper


class _Silent:
    """A reaper that has said nothing yet."""

    pid = 0
    stdout = stderr = None


@pytest.fixture
def reaped() -> Iterator[reaper.Reaped]:
    read, write = os.pipe()
    yield reaper.Reaped(_Silent(), read)  # type: ignore[arg-type]
    os.close(read)
    os.close(write)


def test_a_wait_that_ends_between_two_clock_reads_is_not_an_error(
    reaped: reaper.Reaped, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break (a red team's): the time left was read twice, so a thread descheduled
    between the reads passed select a negative wait (ValueError: a sandbox error, its command
    left running) instead of ending the wait."""
    now = [0.0]

    def tick() -> float:  # each read of the clock 1 ms after the last
        now[0] += 0.001
        return now[0]

    monkeypatch.setattr(reaper.time, "monotonic", tick)
    assert reaped.exited(0.0015) is False
