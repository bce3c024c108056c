"""Prompt leakage: hidden-test inputs and expected values that appear verbatim in what the
policy sees (the prompt and the starter files). A policy could hard-code them.

The values are the literal operands of the tests' assertions (`assert f(x) == y`, unittest's
`self.assert*(...)`) and of `pytest.mark.parametrize`. A value matches whatever its quoting or
spacing in the prompt: strings by their content, containers with whitespace ignored, numbers
only as whole numbers (`1000` is not found in `10000`). `True`, `False` and `None` never
count: a doctest's `True` gives nothing away."""

from __future__ import annotations

import ast
import contextlib
import re

MIN_CHARS = 4  # shorter literals (`0`, `"a"`, `[]`) appear everywhere by chance


def _operands(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            for part in ast.walk(node.test):
                if isinstance(part, ast.Call):
                    found += [*part.args, *(k.value for k in part.keywords)]
                elif isinstance(part, ast.Compare):
                    found += [part.left, *part.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name.startswith("assert") or name == "parametrize":
                args = node.args[1:] if name == "parametrize" else node.args
                for arg in args:  # parametrize: each case, and each value in it
                    found.append(arg)
                    if isinstance(arg, ast.List | ast.Tuple):
                        for case in arg.elts:
                            found.append(case)
                            if isinstance(case, ast.Tuple):
                                found += case.elts
    return found


def _forms(source: str, node: ast.expr) -> tuple[str, list[str]] | None:
    """(how the test writes it, the forms to look for), or None for a non-literal."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    segment = ast.get_source_segment(source, node)
    if not segment:
        return None
    if value is None or isinstance(value, bool):  # one bit: no answer to hard-code
        return None
    if isinstance(value, str):
        return (segment, [value]) if len(value) >= MIN_CHARS else None
    if len(segment) < MIN_CHARS:
        return None
    return segment, [segment, repr(value)]


def _found(form: str, visible: str, compact: str) -> bool:
    if re.fullmatch(r"-?[\d_.eE+]+", form):  # a number: whole numbers only
        return re.search(rf"(?<![\w.]){re.escape(form)}(?![\w.])", visible) is not None
    return "".join(form.split()) in compact


def leaked(hidden_tests: dict[str, str], visible: str) -> list[str]:
    """The hidden tests' literals (as the tests write them) found in `visible`."""
    compact = "".join(visible.split())
    leaks: set[str] = set()
    for path, source in hidden_tests.items():
        if not path.endswith(".py"):
            continue
        with contextlib.suppress(SyntaxError, ValueError, MemoryError, RecursionError):
            tree = ast.parse(source)
            for node in _operands(tree):
                forms = _forms(source, node)
                if forms and any(_found(f, visible, compact) for f in forms[1]):
                    leaks.add(forms[0])
    return sorted(leaks)
