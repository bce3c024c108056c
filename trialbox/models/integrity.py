"""Integrity flags: what the grader's detectors report, and the policy that turns them into the
`integrity_violation` status (docs/sandbox.md, "Integrity flags")."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class Flag(StrEnum):
    ALWAYS_EQUAL = "always_equal"  # an object from the solution equal to a value and a decoy
    FRAMEWORK_TAMPERED = "framework_tampered"  # pytest, its plugins, builtins or sys.modules
    TEST_SOURCE_READ = "test_source_read"  # a hidden test file opened while a test ran
    INTROSPECTION = "introspection"  # the garbage collector's object graph walked in a test
    EARLY_EXIT = "early_exit"  # the grader's process left before its session finished


Action = Literal["violation", "flag"]
# Strict for every flag honest code cannot raise: each of them.
DEFAULT_POLICY: dict[Flag, Action] = dict.fromkeys(Flag, "violation")


def flag_name(finding: str) -> str:
    """`always_equal: detail` -> `always_equal`."""
    return finding.split(":", 1)[0].strip()


def violations(findings: list[str], overrides: dict[Flag, Action]) -> list[str]:
    """The findings the policy makes a violation (an unknown name is one: strict)."""
    policy = DEFAULT_POLICY | overrides
    out = []
    for finding in findings:
        name = flag_name(finding)
        if name not in policy or policy[Flag(name)] == "violation":
            out.append(finding)
    return out
