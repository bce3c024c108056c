"""Scorers: pure functions from the expected tests and their outcomes to a reward."""

from __future__ import annotations

from collections.abc import Callable

from trialbox.models.report import TestOutcome, TestRecord
from trialbox.models.task import Scorer


def passed_expected(tests: list[TestRecord], expected: list[str]) -> int:
    """Only `passed` counts; tests outside `expected` never do."""
    wanted = set(expected)
    return sum(1 for t in tests if t.test_id in wanted and t.outcome == TestOutcome.PASSED)


def tests_pass_fraction(passed: int, expected: int) -> float:
    return passed / expected if expected else 0.0


def all_or_nothing(passed: int, expected: int) -> float:
    return 1.0 if expected and passed == expected else 0.0


SCORERS: dict[Scorer, Callable[[int, int], float]] = {
    Scorer.TESTS_PASS_FRACTION: tests_pass_fraction,
    Scorer.ALL_OR_NOTHING: all_or_nothing,
    Scorer.IO_MATCH: tests_pass_fraction,  # of the cases
}
