"""Scorers: pure functions from the grading spec, the tests' outcomes and the expected ids to a
correctness score (the performance scorer multiplies it by its factors, scoring/performance)."""

from __future__ import annotations

from collections.abc import Callable

from trialbox.models.report import TestOutcome, TestRecord
from trialbox.models.task import GradingSpec, Scorer


def passed_expected(tests: list[TestRecord], expected: list[str]) -> int:
    """Only `passed` counts; tests outside `expected` never do."""
    return len(_passed(tests, expected))


def _passed(tests: list[TestRecord], expected: list[str]) -> set[str]:
    wanted = set(expected)
    return {t.test_id for t in tests if t.test_id in wanted and t.outcome == TestOutcome.PASSED}


def tests_pass_fraction(spec: GradingSpec, tests: list[TestRecord], expected: list[str]) -> float:
    return len(_passed(tests, expected)) / len(expected) if expected else 0.0


def all_or_nothing(spec: GradingSpec, tests: list[TestRecord], expected: list[str]) -> float:
    return 1.0 if expected and len(_passed(tests, expected)) == len(set(expected)) else 0.0


def weighted_tests(spec: GradingSpec, tests: list[TestRecord], expected: list[str]) -> float:
    weights = spec.weights or {}
    total = sum(weights.get(t, 1.0) for t in expected)
    passed = _passed(tests, expected)
    return sum(weights.get(t, 1.0) for t in expected if t in passed) / total if total else 0.0


SCORERS: dict[Scorer, Callable[[GradingSpec, list[TestRecord], list[str]], float]] = {
    Scorer.TESTS_PASS_FRACTION: tests_pass_fraction,
    Scorer.ALL_OR_NOTHING: all_or_nothing,
    Scorer.IO_MATCH: tests_pass_fraction,  # of the cases
    Scorer.WEIGHTED_TESTS: weighted_tests,
    Scorer.PERFORMANCE: tests_pass_fraction,  # times the factors
}
