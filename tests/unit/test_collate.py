"""The grading phase's pure parts: collate the plugin report, filter hijacks, rewrite argv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trialbox.models import TestOutcome as Outcome
from trialbox.models import TestRecord
from trialbox.sandbox.grading import (
    RUNS_APART,
    HijackFilter,
    collate,
    grading_argv,
    starter_entries,
)
from trialbox.sandbox.runtime import Runtime

NONCE = "n-123"
HIDDEN = ["tests/test_a.py"]
F = "tests/test_a.py::"


def event(nonce: str = NONCE, **fields: object) -> bytes:
    return json.dumps({"nonce": nonce} | fields).encode()


def phase(test_id: str, when: str, outcome: str, wasxfail: bool = False, msg: str | None = None):
    return event(
        event="test",
        id=test_id,
        when=when,
        outcome=outcome,
        wasxfail=wasxfail,
        duration=0.25,
        message=msg,
    )


def finish(status: int) -> bytes:
    return event(event="finish", exitstatus=status)


def passing(test_id: str) -> list[bytes]:
    return [phase(test_id, w, "passed") for w in ("setup", "call", "teardown")]


def run(lines: list[bytes], expected: list[str] | None, exit_code: int | None = 1, **kw: bool):
    return collate(b"\n".join(lines) + b"\n", NONCE, expected, HIDDEN, exit_code, **kw)


def test_outcomes_of_every_phase_combination() -> None:
    lines = [
        *passing(F + "ok"),
        phase(F + "fail", "setup", "passed"),
        phase(F + "fail", "call", "failed", msg="assert 1 == 2"),
        phase(F + "fail", "teardown", "passed"),
        phase(F + "setup_err", "setup", "failed", msg="fixture broke"),
        phase(F + "setup_err", "teardown", "passed"),
        phase(F + "teardown_err", "setup", "passed"),
        phase(F + "teardown_err", "call", "passed"),
        phase(F + "teardown_err", "teardown", "failed", msg="cleanup broke"),
        phase(F + "skip", "setup", "skipped", msg="no network"),
        phase(F + "xfail", "setup", "passed"),
        phase(F + "xfail", "call", "skipped", wasxfail=True, msg="known bug"),
        phase(F + "xpass", "setup", "passed"),
        phase(F + "xpass", "call", "passed", wasxfail=True),
        finish(1),
    ]
    names = ["ok", "fail", "setup_err", "teardown_err", "skip", "xfail", "xpass", "gone"]
    result = run(lines, [F + n for n in names])
    assert [(t.test_id.removeprefix(F), t.outcome, t.message) for t in result.tests] == [
        ("ok", Outcome.PASSED, None),
        ("fail", Outcome.FAILED, "assert 1 == 2"),
        ("setup_err", Outcome.ERROR, "fixture broke"),
        ("teardown_err", Outcome.ERROR, "cleanup broke"),
        ("skip", Outcome.SKIPPED, "no network"),
        ("xfail", Outcome.XFAILED, "known bug"),
        ("xpass", Outcome.XPASSED, None),
        ("gone", Outcome.MISSING, "not run"),
    ]
    assert [t.duration_s for t in result.tests] == [0.75, 0.75, 0.5, 0.75, 0.25, 0.5, 0.5, None]
    assert result.expected == [F + n for n in names]
    assert result.anomalies == []
    assert result.pytest_exit_code == 1


def test_null_expected_uses_collected_ids_in_hidden_files() -> None:
    mine = "tests/test_mine.py::test_mine"
    lines = [
        event(event="collected", ids=[F + "one", mine, F + "two"]),
        *passing(F + "one"),
        *passing(mine),
        finish(0),
    ]
    result = run(lines, None, exit_code=0)
    assert result.expected == [F + "one", F + "two"]
    assert result.tests == [
        TestRecord(test_id=F + "one", outcome=Outcome.PASSED, duration_s=0.75),
        TestRecord(test_id=F + "two", outcome=Outcome.MISSING, message="not run"),
        TestRecord(test_id=mine, outcome=Outcome.PASSED, duration_s=0.75),
    ]


def test_collect_errors_are_recorded_last() -> None:
    lines = [
        event(event="collect_error", id="tests/test_b.py", message="SyntaxError: bad"),
        event(event="collect_error", message=None),
        finish(2),
    ]
    result = run(lines, [F + "one"], exit_code=2)
    assert result.tests == [
        TestRecord(test_id=F + "one", outcome=Outcome.MISSING, message="not run"),
        TestRecord(test_id="tests/test_b.py", outcome=Outcome.ERROR, message="SyntaxError: bad"),
        TestRecord(test_id="(collection)", outcome=Outcome.ERROR, message=None),
    ]
    assert result.anomalies == []


def test_lines_without_the_nonce_are_ignored_and_counted() -> None:
    forged = [phase(F + "one", "call", "passed")[:-1] + b', "nonce": "guess"}']
    lines = [
        b"not json",
        event(nonce="wrong", event="finish", exitstatus=0),
        b"[1, 2]",
        *forged,
        finish(5),
    ]
    result = run(lines, [F + "one"], exit_code=5)
    assert result.tests == [
        TestRecord(test_id=F + "one", outcome=Outcome.MISSING, message="not run")
    ]
    assert result.anomalies == ["foreign_report_lines: 4 line(s) without the run's nonce ignored"]


def test_missing_finish_is_session_incomplete() -> None:
    result = run(passing(F + "one"), [F + "one"], exit_code=0)
    assert result.anomalies == ["session_incomplete: pytest stopped before the end of its session"]
    assert result.tests[0].outcome == Outcome.PASSED


def test_finish_status_disagreeing_with_exit_code() -> None:
    result = run([*passing(F + "one"), finish(0)], [F + "one"], exit_code=3)
    assert result.anomalies == ["exit_code_mismatch: pytest reported 0, the process exited 3"]


def test_nonzero_exit_with_every_test_passed_is_an_anomaly() -> None:
    result = run([*passing(F + "one"), finish(1)], [F + "one"], exit_code=1)
    assert result.anomalies == ["exit_without_failures: pytest exited 1 but no test failed"]


def test_tampering_reported_by_the_plugin_and_a_second_finish() -> None:
    lines = [*passing(F + "one"), event(event="finish", exitstatus=0, tampered=["x.y"])]
    result = run([*lines, finish(0)], [F + "one"], exit_code=0)
    assert result.anomalies == [
        "pytest_tampered: x.y replaced",
        "duplicate_report: a second session finish",
    ]


def test_no_mismatch_when_the_exit_code_is_unknown() -> None:
    assert run([*passing(F + "one"), finish(0)], [F + "one"], exit_code=None).anomalies == []


def test_exit_zero_with_failures() -> None:
    lines = [phase(F + "one", "call", "failed", msg="no"), finish(0)]
    result = run(lines, [F + "one"], exit_code=0)
    assert result.anomalies == ["exit_zero_with_failures: pytest exited 0 although tests failed"]


def test_duplicate_phase_and_overflow() -> None:
    lines = [*passing(F + "one"), phase(F + "one", "call", "passed"), finish(0)]
    result = run(lines, [F + "one"], exit_code=0, overflowed=True)
    assert result.anomalies == [
        f"duplicate_report: {F}one call",
        "report_overflow: the plugin's report exceeded its cap",
    ]


@pytest.fixture
def hijack(tmp_path: Path) -> HijackFilter:
    return HijackFilter(
        source=tmp_path,
        protected=frozenset(sys.stdlib_module_names) | {"pytest"},
        trusted=frozenset({"queue.py"}),
        boundary=False,
    )


@pytest.mark.parametrize(
    ("rel", "is_dir", "reason"),
    [
        ("conftest.py", False, "conftest.py can rewrite pytest's behaviour"),
        ("tests/conftest.py", False, "conftest.py can rewrite pytest's behaviour"),
        ("pytest.ini", False, "pytest config (the grader uses its own)"),
        ("pytest.py", False, "shadows the module 'pytest'"),
        ("json.py", False, "shadows the module 'json'"),
        ("tests/json.py", False, "shadows the module 'json'"),
        ("solution.py", False, RUNS_APART),  # in_process: from SOLUTION_DIR, never the root
        ("queue.py", False, RUNS_APART),
        ("data.txt", False, None),
        ("lib/queue.py", False, "shadows the module 'queue'"),
        ("__pycache__", True, "bytecode cache"),
        ("x.pyc", False, "bytecode"),
        ("sitecustomize.py", False, "python startup hook"),
        ("a.pth", False, "python startup hook"),
        ("tests", True, None),
    ],
)
def test_hijack_filter(hijack: HijackFilter, rel: str, is_dir: bool, reason: str | None) -> None:
    assert hijack(rel, is_dir) == reason


def test_in_process_imports_only_the_starters_modules(hijack: HijackFilter) -> None:
    prune = hijack.solution_tree(starter_entries(["solution.py", "pkg/__init__.py", "README"]))
    assert prune("solution.py", False) is None
    assert prune("pkg", True) is None
    assert prune("pkg/core.py", False) is None
    assert prune("pkg/conftest.py", False) == "conftest.py can rewrite pytest's behaviour"
    assert prune("helpers.py", False) == "not one of the starter's modules"
    assert prune("tests", True) == "not one of the starter's modules"
    boundary = HijackFilter(hijack.source, hijack.protected, hijack.trusted)
    assert boundary("conftest.py", False) == RUNS_APART  # silent: nothing of it runs here


def test_hijack_filter_package_dirs(hijack: HijackFilter, tmp_path: Path) -> None:
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "email").mkdir()  # no __init__.py: a namespace dir loses to the stdlib package
    assert hijack("json", True) == "package shadows the module 'json'"
    assert hijack("email", True) is None


def test_grading_argv() -> None:
    runtime = Runtime(root=Path("/opt/rt"), version="v", hash="h")
    argv = grading_argv(["python", "-m", "pytest", "-q", "tests"], runtime, "/grade")
    assert argv == [
        "python",
        "-P",
        "-m",
        "pytest",
        "-p",
        "trialbox_report",
        "-c",
        "/opt/rt/trialbox/pytest.ini",
        "--rootdir=/grade",
        "--confcutdir=/grade",
        "-q",
        "tests",
    ]
    assert grading_argv(["pytest", "-x"], runtime, "/grade")[-1:] == ["-x"]


def test_events_with_the_nonce_but_a_bad_shape_are_malformed_not_a_crash() -> None:
    lines = [
        event(event="finish", exitstatus=None),
        event(event="test", id="tests/test_a.py::one", when="call"),
        event(event="test", id="tests/test_a.py::one", when="call", outcome="won"),
        *passing(F + "one"),
        finish(0),
    ]
    result = run(lines, [F + "one"], exit_code=0)
    assert result.anomalies == ["malformed_report: 3 line(s) with the nonce but a bad shape"]
    assert [t.outcome for t in result.tests] == [Outcome.PASSED]
