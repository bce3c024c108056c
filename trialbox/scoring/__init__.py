"""Reward scoring: pure functions from (grading spec, raw run report) to a typed result."""

from __future__ import annotations

from trialbox.models.integrity import flag_name, violations
from trialbox.models.report import RunReport, Status
from trialbox.models.result import ExecutionResult, reward_for
from trialbox.models.task import GradingSpec
from trialbox.scoring.feedback import feedback
from trialbox.scoring.performance import factors
from trialbox.scoring.scorers import SCORERS, passed_expected

# Anomalies meaning the plugin's report cannot be trusted: the reward is then 0.
UNTRUSTED_ANOMALIES = (
    "session_incomplete",
    "exit_code_mismatch",
    "exit_zero_with_failures",
    "report_overflow",
    "duplicate_report",
    "malformed_report",
    "exit_without_failures",
    "pytest_tampered",
    "grading_setup_failed",
)


def score(spec: GradingSpec, report: RunReport, request_id: str | None = None) -> ExecutionResult:
    grading = report.grading
    flags: list[str] = []
    untrusted: list[str] = []
    passed = expected = 0
    scored: float | None = None
    caught: list[str] = []
    error = report.error
    breakdown: dict[str, float] = {}
    if grading is not None:
        expected = len(grading.expected_tests)
        passed = passed_expected(grading.tests, grading.expected_tests)
        if grading.expected_tests_unknown:
            flags.append("expected_tests_unknown")
        # A killed grader (timeout, OOM) never finishes its session: that is not tampering.
        untrusted = (
            sorted({a.split(":", 1)[0] for a in grading.anomalies} & set(UNTRUSTED_ANOMALIES))
            if report.status == Status.SUCCEEDED
            else []
        )
        flags.extend(f"untrusted_report:{name}" for name in untrusted)
        if grading.neutralized:
            flags.append("neutralized_files")
        scored = (
            0.0 if untrusted else SCORERS[spec.scorer](spec, grading.tests, grading.expected_tests)
        )
        breakdown = {"tests_passed": passed, "tests_expected": expected, "score": scored}
        measured = grading.performance
        if spec.performance is not None and measured is not None:
            if measured.reference_failed:  # the scorer's own failure: no reward, loss masked
                error = f"the performance scorer failed: {measured.reference_failed}"
            else:
                measures = factors(measured, spec.performance)
                breakdown |= measures
                scored *= measures["speed_factor"] * measures.get("memory_factor", 1.0)
        flags.extend(f"integrity:{flag_name(f)}" for f in grading.integrity)
        caught = violations(grading.integrity, spec.integrity)
    status = report.status
    if caught and status == Status.SUCCEEDED:
        status = Status.INTEGRITY_VIOLATION
    text = feedback(report, passed, expected, untrusted, caught)
    slowed = grading.performance.policy_failed if grading and grading.performance else None
    if slowed and status == Status.SUCCEEDED:
        text += f"\n{slowed}: speed factor 0"
    if error is not None and status == Status.SUCCEEDED:
        status, scored = Status.SANDBOX_ERROR, None
        text = f"sandbox error (not your code): {error}"
    if status == Status.SUCCEEDED and grading is None:
        scored = None  # ran but was not graded: no reward, but the trainer may still learn
    reward, loss_mask = reward_for(status, scored)
    return ExecutionResult(
        request_id=request_id,
        task_id=report.task_id,
        sample_id=report.sample_id,
        status=status,
        reward=reward,
        reward_breakdown=breakdown,
        loss_mask=loss_mask,
        tests_passed=passed,
        tests_expected=expected,
        feedback=text,
        flags=flags,
        notes=report.notes,
        error=error,
        commands=report.commands,
        tests=grading.tests if grading else [],
        checkpoint=report.checkpoint,
        provenance=report.provenance,
    )


__all__ = ["score"]
