"""`trialbox run`'s Ctrl-C: the first SIGINT stops sending and waits the grace for what is in
flight, and the grace's end quits; the host's own alarm (pytest-timeout's here) is untouched."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from trialbox.cli import run


class Job:
    def __init__(self) -> None:
        self.interrupted = 0

    def interrupt(self) -> int:
        self.interrupted += 1
        return 3


def test_the_grace_ends_with_a_keyboard_interrupt_and_leaves_the_alarm_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "GRACE_S", 0.3)
    monkeypatch.setattr(run, "err", run.Console(stderr=True))
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # pytest-timeout's, for this test
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGALRM)
    job: Any = Job()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), run._stop_on_signals(job):
        signal.raise_signal(signal.SIGINT)
        assert job.interrupted == 1  # it goes on, waiting for the 3 in flight
        time.sleep(30)  # the grace ends this
    assert time.monotonic() - started < 10
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # still set
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGALRM)) == before
    assert "waiting up to 0.3 s for 3 sample(s) in flight" in capsys.readouterr().err


def test_a_second_ctrl_c_quits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "GRACE_S", 60)
    job: Any = Job()
    with pytest.raises(KeyboardInterrupt), run._stop_on_signals(job):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert job.interrupted == 1
