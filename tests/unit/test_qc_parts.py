"""Task QC's pure parts: the reference's mutants and the prompt-leakage scan."""

from __future__ import annotations

import ast

from trialbox.qc.leakage import leaked
from trialbox.qc.mutants import all_mutants, mutants

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


def test_leaks_match_whatever_the_quoting_or_spacing_and_numbers_only_whole() -> None:
    hidden = {
        "tests/test_y.py": (
            "import pytest\n"
            "from solution import f\n"
            'def test_a():\n    assert f("hello world") == [10, 20, 30]\n'
            "@pytest.mark.parametrize('x, want', [(1234, 'four digits'), (5, 'five')])\n"
            "def test_b(x, want):\n    assert f(x) == want\n"
        )
    }
    assert leaked(hidden, "f('hello world') gives [10,20,30]") == ['"hello world"', "[10, 20, 30]"]
    assert leaked(hidden, "n is at most 12345") == []  # 1234 only as a whole number
    assert leaked(hidden, "try 1234: it has four digits") == ["'four digits'", "1234"]


def test_true_false_and_none_carry_no_answer_so_they_never_count_as_leaks() -> None:
    hidden = {"tests/test_z.py": "def test_a():\n    assert f(3) == True\n    assert g() is None\n"}
    assert leaked(hidden, ">>> f(3)\nTrue\n>>> g()\nNone") == []


def test_mutants_skip_the_main_guard_cover_augmented_assignments_and_keep_the_budget() -> None:
    script = (
        "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n"
        'if __name__ == "__main__":\n    print(total([1]))\n'
    )
    found = mutants("main.py", script, limit=50)
    assert "Add -> Sub" in {m.change for m in found}  # s += x
    assert not any("__main__" in m.source and "!=" in m.source for m in found)
    assert [m.line for m in found] == sorted(m.line for m in found)  # source order
    many = {f"m{n}.py": "def f(a):\n    return a + 1\n" for n in range(10)}
    assert len(all_mutants(many, 4)) == 4  # one budget over all the files
    assert mutants("bom.py", "\ufeffdef f(a):\n    return a - 1\n", limit=2)
