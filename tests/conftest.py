"""The suite's set-up: each test process's own sandbox state, and under xdist (`make test`)
the grouping and order of the work (tests/support/schedule.py)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.support import schedule
from tests.support.pools import reserve


def _runs_tests(config: pytest.Config) -> bool:
    """An xdist worker, or a run without workers; not the xdist controller."""
    return "PYTEST_XDIST_WORKER" in os.environ or not config.getoption("numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    # Before any fixture makes a runner: twins, CLI runs and their workers inherit it.
    if _runs_tests(config):
        os.environ.update(reserve().env())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    schedule.slowest_groups_first(items, schedule.known_durations())


class _Groups(LoadScopeScheduling):
    """xdist's scheduling by scope, with our groups as the scopes (kept in collection order:
    `--no-loadscope-reorder`)."""

    def _split_scope(self, nodeid: str) -> str:
        return schedule.group_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> _Groups:
    return _Groups(config, log)


# Seconds per test (setup, call and teardown), for the next run's order.
_spent: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller sees every worker's reports
        schedule.record(dict(_spent))
