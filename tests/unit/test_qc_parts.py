"""Task QC's pure parts: the reference's mutants and the prompt-leakage scan."""

from __future__ import annotations

import ast

from trialbox.qc.leakage import leaked
from trialbox.qc.mutants import mutants

REFERENCE = (
    "def classify(n, limit=10):\n"
    "    if n < 0 and limit > 0:\n"
    "        return 'negative'\n"
    "    return n * 2 + 1\n"
)


def test_each_mutant_changes_one_thing_and_still_parses() -> None:
    found = mutants("solution.py", REFERENCE, limit=50)
    changes = {m.change for m in found}
    assert {"Lt -> LtE", "Gt -> GtE", "And -> Or", "Mult -> Add", "Add -> Sub"} <= changes
    assert "returns None" in changes and any(c.startswith("constant") for c in changes)
    original = ast.unparse(ast.parse(REFERENCE))
    for mutant in found:
        assert mutant.path == "solution.py" and mutant.line >= 1
        assert ast.unparse(ast.parse(mutant.source)) != original  # parses, and differs
    assert len({m.source for m in found}) == len(found)  # no two alike


def test_mutants_are_capped_and_a_file_that_does_not_parse_has_none() -> None:
    assert len(mutants("solution.py", REFERENCE, limit=3)) == 3
    assert mutants("solution.py", "def broken(:\n", limit=5) == []
    assert mutants("data.py", "NAMES = ['a']\n", limit=5) == []


HIDDEN = {
    "tests/test_x.py": (
        "from solution import f\n"
        "def test_a():\n    assert f([3, 1, 2]) == [1, 2, 3]\n"
        "def test_b():\n    assert f('hello world') == 'dlrow olleh'\n"
        "def test_c():\n    assert f(1) == 1\n"  # too short to count
    ),
    "tests/data.json": "[1, 2, 3]",
}


def test_assertion_literals_shown_in_the_prompt_are_flagged() -> None:
    prompt = "Example: f([3, 1, 2]) gives [1, 2, 3]."
    assert leaked(HIDDEN, prompt) == ["[1, 2, 3]", "[3, 1, 2]"]
    assert leaked(HIDDEN, "Reverse a string, e.g. 'hello world'") == ["'hello world'"]
    assert leaked(HIDDEN, "Sort a list.") == []
    assert leaked({"tests/t.py": "def broken(:\n"}, "anything") == []
