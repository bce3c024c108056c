"""score(spec, report): rewards, loss masks, flags and feedback from hand-built run reports."""

from __future__ import annotations

from trialbox.models import (
    CommandResult,
    GradingReport,
    GradingSpec,
    Limits,
    Provenance,
    RunReport,
    Scorer,
    Status,
    TestRecord,
)
from trialbox.models import TestOutcome as Outcome
from trialbox.scoring import score

A, B = "tests/test_a.py::test_one", "tests/test_a.py::test_two"


def command(status: Status = Status.SUCCEEDED, stderr: str = "") -> CommandResult:
    return CommandResult(
        phase="grading",
        argv=["python", "-m", "pytest"],
        status=status,
        exit_code=None if status in (Status.TIMEOUT, Status.OOM) else 1,
        signal=None,
        timed_out=status == Status.TIMEOUT,
        oom_killed=status == Status.OOM,
        wall_s=1.0,
        cpu_s=0.5,
        peak_memory_mb=20.0,
        stdout="",
        stderr=stderr,
        stdout_truncated=False,
        stderr_truncated=False,
    )


def report(
    tests: list[TestRecord] | None,
    expected: list[str],
    status: Status = Status.SUCCEEDED,
    anomalies: list[str] | None = None,
    unknown: bool = False,
    stderr: str = "",
    error: str | None = None,
) -> RunReport:
    grading = None
    if tests is not None:
        grading = GradingReport(
            command=["python", "-P", "-m", "pytest"],
            pytest_exit_code=1,
            tests=tests,
            expected_tests=expected,
            expected_tests_unknown=unknown,
            neutralized=[],
            anomalies=anomalies or [],
        )
    return RunReport(
        task_id="t",
        sample_id="s",
        status=status,
        commands=[command(status, stderr)],
        grading=grading,
        error=error,
        provenance=Provenance(
            runner_version="0.1.0",
            backend="rlimit",
            runtime_version="v",
            runtime_hash="h",
            limits=Limits(),
            grading_timeout_s=10,
        ),
    )


def rec(test_id: str, outcome: Outcome, message: str | None = None) -> TestRecord:
    return TestRecord(test_id=test_id, outcome=outcome, message=message)


FRACTION = GradingSpec(command=["pytest"])
ALL_OR_NOTHING = GradingSpec(command=["pytest"], scorer=Scorer.ALL_OR_NOTHING)
HALF = [rec(A, Outcome.PASSED), rec(B, Outcome.FAILED, "assert 1 == 2")]


def test_pass_fraction_half() -> None:
    result = score(FRACTION, report(HALF, [A, B]), request_id="r1")
    assert (result.reward, result.loss_mask) == (0.5, False)
    assert (result.tests_passed, result.tests_expected) == (1, 2)
    assert result.reward_breakdown == {"tests_passed": 1.0, "tests_expected": 2.0, "score": 0.5}
    assert result.request_id == "r1"
    assert result.flags == []
    assert result.feedback == f"1/2 tests passed\nFAILED {B}: assert 1 == 2"


def test_all_or_nothing() -> None:
    assert score(ALL_OR_NOTHING, report(HALF, [A, B])).reward == 0.0
    both = [rec(A, Outcome.PASSED), rec(B, Outcome.PASSED)]
    result = score(ALL_OR_NOTHING, report(both, [A, B]))
    assert result.reward == 1.0
    assert result.feedback == "all 2 tests passed"


def test_only_passed_counts() -> None:
    outcomes = [
        Outcome.PASSED,
        Outcome.SKIPPED,
        Outcome.XFAILED,
        Outcome.XPASSED,
        Outcome.ERROR,
        Outcome.MISSING,
    ]
    ids = [f"tests/test_a.py::test_{i}" for i in range(len(outcomes))]
    tests = [rec(i, o) for i, o in zip(ids, outcomes, strict=True)]
    result = score(FRACTION, report(tests, ids))
    assert result.tests_passed == 1
    assert result.reward == 1 / 6


def test_tests_outside_expected_never_count() -> None:
    tests = [*HALF, rec("tests/test_mine.py::test_mine", Outcome.PASSED)]
    result = score(FRACTION, report(tests, [A, B]))
    assert (result.tests_passed, result.tests_expected, result.reward) == (1, 2, 0.5)


def test_zero_expected_scores_zero() -> None:
    result = score(FRACTION, report([], []))
    assert (result.reward, result.loss_mask) == (0.0, False)
    assert result.feedback == "no tests ran"


def test_timeout_is_zero_with_feedback() -> None:
    result = score(FRACTION, report([], [A], status=Status.TIMEOUT))
    assert (result.status, result.reward, result.loss_mask) == (Status.TIMEOUT, 0.0, False)
    assert result.feedback == "grading timed out after 10 s"


def test_oom_is_zero_with_feedback() -> None:
    result = score(FRACTION, report([], [A], status=Status.OOM))
    assert (result.reward, result.loss_mask) == (0.0, False)
    assert result.feedback == "grading killed: memory limit 512 MiB"


def test_sandbox_error_is_masked() -> None:
    result = score(FRACTION, report(None, [], status=Status.SANDBOX_ERROR, error="bwrap: boom"))
    assert (result.reward, result.loss_mask) == (None, True)
    assert result.error == "bwrap: boom"
    assert result.feedback == "sandbox error (not your code): bwrap: boom"
    assert result.reward_breakdown == {}


def test_succeeded_but_not_graded_has_no_reward() -> None:
    result = score(FRACTION, report(None, []))
    assert (result.reward, result.loss_mask, result.feedback) == (None, False, "not graded")


def test_untrusted_anomaly_zeroes_the_reward() -> None:
    tests = [rec(A, Outcome.PASSED)]
    anomalies = ["session_incomplete: pytest stopped before the end of its session"]
    result = score(FRACTION, report(tests, [A], anomalies=anomalies))
    assert (result.reward, result.loss_mask) == (0.0, False)
    assert result.flags == ["untrusted_report:session_incomplete"]
    assert result.reward_breakdown["score"] == 0.0


def test_foreign_lines_alone_are_not_untrusted() -> None:
    anomalies = ["foreign_report_lines: 1 line(s) without the run's nonce ignored"]
    result = score(FRACTION, report([rec(A, Outcome.PASSED)], [A], anomalies=anomalies))
    assert (result.reward, result.flags) == (1.0, [])


def test_expected_tests_unknown_flag() -> None:
    result = score(FRACTION, report([rec(A, Outcome.PASSED)], [A], unknown=True))
    assert result.flags == ["expected_tests_unknown"]
    assert result.reward == 1.0


def test_feedback_lists_failures_with_messages_and_stderr_tail() -> None:
    tests = [
        rec(A, Outcome.FAILED, "assert 1 == 2\nwhere 1 = add(0, 1)"),
        rec(B, Outcome.MISSING, "not run"),
    ]
    result = score(FRACTION, report(tests, [A, B], stderr="E boom\nlast line\n"))
    assert result.feedback == (
        f"0/2 tests passed\nFAILED {A}: assert 1 == 2 where 1 = add(0, 1)\n"
        f"NOT RUN (1): {B}\nE boom\nlast line"
    )


def test_feedback_caps_the_failures_shown() -> None:
    ids = [f"tests/test_a.py::test_{i}" for i in range(10)]
    tests = [rec(ids[0], Outcome.PASSED)] + [rec(i, Outcome.FAILED, "no") for i in ids[1:]]
    result = score(FRACTION, report(tests, ids))
    assert result.feedback == "\n".join(
        ["1/10 tests passed"] + [f"FAILED {i}: no" for i in ids[1:9]] + ["... and 1 more"]
    )


def test_killed_grader_is_not_flagged_untrusted() -> None:
    anomalies = ["session_incomplete: pytest stopped before the end of its session"]
    result = score(FRACTION, report([], [A], status=Status.TIMEOUT, anomalies=anomalies))
    assert (result.reward, result.flags) == (0.0, [])


def test_a_long_failure_message_keeps_its_tail_from_a_word_start() -> None:
    message = "Traceback " + "frame " * 100 + "AssertionError: assert 1 == 2"
    failed = [rec(A, Outcome.PASSED), rec(B, Outcome.FAILED, message)]
    line = score(FRACTION, report(failed, [A, B])).feedback.splitlines()[1]
    shown = line.split(": ", 1)[1]
    assert shown.startswith("...frame ") and shown.endswith("AssertionError: assert 1 == 2")
    assert len(shown) <= 303


def test_an_agent_command_the_runner_stopped_is_noted_when_the_run_went_on() -> None:
    passed = report([rec(A, Outcome.PASSED)], [A])
    stuck = command(Status.TIMEOUT).model_copy(update={"phase": "agent", "argv": ["bash"]})
    result = score(FRACTION, passed.model_copy(update={"commands": [stuck, *passed.commands]}))
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)
    assert result.feedback == "all 1 tests passed\nnote: command 'bash' timed out after 10 s"


def test_a_grading_timeout_is_said_of_the_grading_when_an_agent_command_timed_out_too() -> None:
    """Was a break: the feedback named the first command with the sample's status, an agent
    command, when the grading timed out ("command 'bash' timed out" for a grading timeout)."""
    late = report([], [A], status=Status.TIMEOUT)
    stuck = command(Status.TIMEOUT).model_copy(update={"phase": "agent", "argv": ["bash"]})
    result = score(FRACTION, late.model_copy(update={"commands": [stuck, *late.commands]}))
    assert result.feedback == "grading timed out after 10 s"
