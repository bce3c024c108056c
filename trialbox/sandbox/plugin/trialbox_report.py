"""Trusted pytest plugin, loaded from the sandbox runtime (never from the workspace).

It reports every collected id and every test phase as JSON lines on a pipe the runner passed
in, tagged with a per-run nonce, then appends the grading root to sys.path *after* the
runtime's own paths so no workspace file can shadow pytest, its plugins or the stdlib.
Standard library only: it runs inside the sandbox runtime.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

Emit = Callable[[dict[str, object]], None]


def _make_emitter() -> Emit:
    # Read once and scrub from the environment before any workspace code is imported.
    fd = int(os.environ.pop("TRIALBOX_REPORT_FD"))
    nonce = os.environ.pop("TRIALBOX_REPORT_NONCE")

    def emit(event: dict[str, object]) -> None:
        event["nonce"] = nonce
        data = (json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(fd, data) :]

    return emit


_emit = _make_emitter()
sys.path.append(os.environ.pop("TRIALBOX_GRADING_ROOT"))

MESSAGE_CHARS = 2000


def _message(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    if not report.failed and not report.skipped:
        return None
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = str(crash.message)
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        text = str(longrepr[2])
    else:
        text = report.longreprtext
    return text[-MESSAGE_CHARS:]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _emit({"event": "collect_error", "id": report.nodeid, "message": _message(report)})


def pytest_collection_finish(session: pytest.Session) -> None:
    _emit({"event": "collected", "ids": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _emit(
        {
            "event": "test",
            "id": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "wasxfail": hasattr(report, "wasxfail"),
            "duration": report.duration,
            "message": _message(report),
        }
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _emit({"event": "finish", "exitstatus": int(exitstatus)})
