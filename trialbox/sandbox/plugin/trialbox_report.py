"""Trusted pytest plugin, loaded from the sandbox runtime (never from the workspace).

It reports every collected id and every test phase as JSON lines on a pipe the runner passed
in, tagged with a per-run nonce, then appends the grading root to sys.path *after* the
runtime's own paths so no workspace file can shadow pytest, its plugins or the stdlib.

The solution runs in this process, so tampering cannot be made impossible, only hard and
visible: the emitter is bound to each hook as a default argument (a replaced module global
changes nothing), and pytest's reporting internals are fingerprinted at import and compared at
the end of the session. Standard library only: it runs inside the sandbox runtime.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import _pytest.main
import _pytest.python
import _pytest.reports
import _pytest.runner

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


_EMIT = _make_emitter()
sys.path.append(os.environ.pop("TRIALBOX_GRADING_ROOT"))

MESSAGE_CHARS = 2000
# What a solution would patch to turn failures into passes.
_WATCHED = {
    "TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
    "TestReport.__init__": (_pytest.reports.TestReport, "__init__"),
    "CollectReport.__init__": (_pytest.reports.CollectReport, "__init__"),
    "runner.call_and_report": (_pytest.runner, "call_and_report"),
    "runner.runtestprotocol": (_pytest.runner, "runtestprotocol"),
    "runner.call_runtest_hook": (_pytest.runner, "call_runtest_hook"),
    "runner.CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
    "python.pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
    "main.pytest_runtestloop": (_pytest.main, "pytest_runtestloop"),
}
_ORIGINAL = {name: vars(owner).get(attr) for name, (owner, attr) in _WATCHED.items()}


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


def pytest_collectreport(report: pytest.CollectReport, _emit: Emit = _EMIT) -> None:
    if report.failed:
        _emit({"event": "collect_error", "id": report.nodeid, "message": _message(report)})


def pytest_collection_finish(session: pytest.Session, _emit: Emit = _EMIT) -> None:
    _emit({"event": "collected", "ids": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report: pytest.TestReport, _emit: Emit = _EMIT) -> None:
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


_HOOKS = (pytest_collectreport, pytest_collection_finish, pytest_runtest_logreport)
_HOOK_CODE = {hook.__name__: (hook.__code__, hook.__defaults__) for hook in _HOOKS}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int, _emit: Emit = _EMIT) -> None:
    tampered = [
        name
        for name, (owner, attr) in _WATCHED.items()
        if vars(owner).get(attr) is not _ORIGINAL[name]
    ]
    tampered += [
        f"trialbox_report.{hook.__name__}"
        for hook in _HOOKS
        if (hook.__code__, hook.__defaults__) != _HOOK_CODE[hook.__name__]
    ]
    _emit({"event": "finish", "exitstatus": int(exitstatus), "tampered": tampered})
