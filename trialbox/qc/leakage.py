"""Prompt leakage: hidden-test inputs and expected values that appear verbatim in what the
policy sees (the prompt and the starter files). A policy could hard-code them."""

from __future__ import annotations

import ast
import contextlib

MIN_CHARS = 4  # shorter literals (`0`, `"a"`, `[]`) appear everywhere by chance


def _literal_segments(source: str) -> set[str]:
    """The source text of each literal operand of an assertion in a test file: the values a
    test compares against, and the arguments of the calls it makes there."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for part in ast.walk(node.test):
            if isinstance(part, ast.Call):
                candidates = [*part.args, *(k.value for k in part.keywords)]
            elif isinstance(part, ast.Compare):
                candidates = [part.left, *part.comparators]
            else:
                continue
            for operand in candidates:
                with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError):
                    ast.literal_eval(operand)
                    segment = ast.get_source_segment(source, operand)
                    if segment and len(segment) >= MIN_CHARS:
                        found.add(segment)
    return found


def leaked(hidden_tests: dict[str, str], visible: str) -> list[str]:
    """Literals of the hidden tests' assertions found verbatim in `visible`."""
    segments: set[str] = set()
    for path, source in hidden_tests.items():
        if path.endswith(".py"):
            segments |= _literal_segments(source)
    return sorted(s for s in segments if s in visible)
