"""The suite's set-up: each test process's own sandbox state, a seat of the machine's for each
test (tests/support/seats.py), and under xdist (`make test`) the grouping and order of the work
(tests/support/schedule.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.support import schedule, seats
from tests.support.pools import reserve

UNIT = Path(__file__).parent / "unit"


def _runs_tests(config: pytest.Config) -> bool:
    """An xdist worker, or a run without workers; not the xdist controller."""
    return "PYTEST_XDIST_WORKER" in os.environ or not config.getoption("numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    # Ctrl-C reaches the tests and the commands they start, however the suite was started: a
    # shell's background job inherits SIGINT ignored (and so would xdist's workers).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Before any fixture makes a runner: twins, CLI runs and their workers inherit it. Only
    # root runs sandboxes (a non-root run is the unit level, and /var/lib is not its to write).
    if _runs_tests(config) and os.geteuid() == 0:
        os.environ.update(reserve().env())


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's: waiting is free
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Every test in a seat of the machine's (tests/support/seats.py). Tests marked `alone`
    one after the other (schedule.slowest_groups_first puts a module's together) keep every
    seat from the first to the last: the machine's seats drain once for them."""
    if os.geteuid() != 0 or item.path.is_relative_to(UNIT):  # the unit level: it is light
        return (yield)  # (and /run/lock is only root's to write)
    known = item.config.stash.get(_KNOWN, None)
    expected_s = known.record.get(item.nodeid, 0.0) if known is not None else 0.0
    if not schedule.alone(item):
        with seats.seat(expected_s=expected_s):
            return (yield)
    session = item.session

    def last() -> bool:  # pytest tears everything down at once when it stops (-x, Ctrl-C)
        stops = bool(session.shouldfail or session.shouldstop)
        return stops or nextitem is None or not schedule.alone(nextitem)

    with _IN_A_ROW.alone(last, expected_s):
        return (yield)


_IN_A_ROW = seats.InARow()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)  # an xdist worker: the controller's
    known = schedule.Known(**workerinput["durations"]) if workerinput else schedule.Known.read()
    config.stash[_KNOWN] = known  # each test's expected time, written in its seat
    schedule.slowest_groups_first(items, known)


_KNOWN = pytest.StashKey[schedule.Known]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Every worker gets the times the controller read once."""
    if _KNOWN not in node.config.stash:
        node.config.stash[_KNOWN] = schedule.Known.read()
    node.workerinput["durations"] = dataclasses.asdict(node.config.stash[_KNOWN])


class _Groups(LoadScopeScheduling):
    """xdist's scheduling by scope, with our groups as the scopes (kept in collection order:
    `--no-loadscope-reorder`)."""

    def _split_scope(self, nodeid: str) -> str:
        return schedule.group_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> _Groups | None:
    """Our groups for `--dist loadscope` (make test); xdist's own for any other mode."""
    return _Groups(config, log) if config.getoption("dist") == "loadscope" else None


_spent: defaultdict[str, float] = defaultdict(float)  # per test: setup, call and teardown


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Each process that ran tests records their times, for the next run's order."""
    if _runs_tests(session.config):
        schedule.record(dict(_spent))
