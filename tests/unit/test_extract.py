"""Code extraction: which fenced block of a completion is its code, and which file it goes in."""

from __future__ import annotations

from typing import Any

import pytest

from trialbox.errors import InputError
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task
from trialbox.sdk.extract import extract_code, files_for
from trialbox.sdk.groups import plan

SOLUTION = "def add(a, b):\n    return a + b\n"

GPT_STYLE = f"""Here is the solution:

```python
{SOLUTION}```

Explanation: `add` returns the sum of its two arguments, so `add(1, 2)` is `3`.
"""

R1_STYLE = f"""<think>
The user wants add(a, b). A first draft:
```python
def add(a, b):
    return a - b
```
Wait, that subtracts. Fix the operator.
</think>

The function adds its arguments:

```python
{SOLUTION}```
"""

PYTHON_THEN_USAGE = f"""Save this as `solution.py`:

```python
{SOLUTION}```

Then run it:

```bash
python -c "from solution import add; print(add(1, 2))"
```
"""


# --- which block ---------------------------------------------------------------------------


def test_gpt_style_answer_gives_its_python_block() -> None:
    assert extract_code(GPT_STYLE) == SOLUTION


def test_r1_style_final_answer_wins_over_the_draft_in_think() -> None:
    assert extract_code(R1_STYLE) == SOLUTION


def test_fence_right_after_a_think_line_counts() -> None:
    # As an HTML block, `<think>` would swallow everything up to the first blank line.
    completion = "<think>\nPlan:\n```python\nx = 1\n```\nDone.\n</think>\nThe answer is above."
    assert extract_code(completion) == "x = 1\n"


def test_think_cut_off_mid_reasoning_still_gives_its_block() -> None:
    assert extract_code("<think>\nTry:\n```py\nx = 2\n```\nHmm, maybe") == "x = 2\n"


def test_python_block_wins_over_a_later_bash_usage_example() -> None:
    assert extract_code(PYTHON_THEN_USAGE) == SOLUTION


def test_last_python_block_wins() -> None:
    completion = "First try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\nDone."
    assert extract_code(completion) == "x = 2\n"


def test_only_a_bash_block_falls_back_to_it() -> None:
    completion = "Run this:\n```bash\npip install numpy\n```\n"
    assert extract_code(completion) == "pip install numpy\n"


def test_fallback_takes_the_last_block_of_any_language() -> None:
    completion = "```bash\nls\n```\n\n```\nprint(1)\n```\n\n```json\n{}\n```\n"
    assert extract_code(completion) == "{}\n"


def test_block_without_info_string_is_a_fallback() -> None:
    assert extract_code("Code:\n```\nprint('hi')\n```\n") == "print('hi')\n"


@pytest.mark.parametrize(
    "info", ["python", "py", "python3", "py3", "Python", "PY", "python title=solution.py"]
)
def test_python_names_in_the_info_string(info: str) -> None:
    completion = f"```{info}\nx = 1\n```\n\n```text\nnot code\n```\n"
    assert extract_code(completion) == "x = 1\n"


@pytest.mark.parametrize("info", ["pycon", "pythonic", "cython", "text python"])
def test_other_names_are_not_python(info: str) -> None:
    completion = f"```python\nx = 1\n```\n\n```{info}\n>>> x\n```\n"
    assert extract_code(completion) == "x = 1\n"


# --- what is a fence (CommonMark) ----------------------------------------------------------


def test_tilde_fence() -> None:
    assert extract_code("Solution:\n~~~python\nx = 1\n~~~\n") == "x = 1\n"


def test_four_backtick_fence_keeps_the_triple_backticks_inside() -> None:
    completion = '''````python
DOC = """
```
example
```
"""
````
That string holds a fence.'''
    assert extract_code(completion) == 'DOC = """\n```\nexample\n```\n"""\n'


def test_fence_inside_a_numbered_list_item_is_dedented() -> None:
    completion = (
        "Steps:\n\n"
        "1. Read the input.\n"
        "2. Write the function:\n"
        "   ```python\n"
        "   def add(a, b):\n"
        "       return a + b\n"
        "   ```\n"
        "3. Test it.\n"
    )
    assert extract_code(completion) == SOLUTION


def test_fence_inside_a_blockquote() -> None:
    assert extract_code("> ```python\n> x = 1\n> ```\n") == "x = 1\n"


def test_unclosed_final_fence_runs_to_the_end() -> None:
    completion = "Here:\n```python\ndef add(a, b):\n    return a +"
    assert extract_code(completion) == "def add(a, b):\n    return a +"


def test_unclosed_fence_after_a_closed_one_is_the_last_block() -> None:
    completion = "```python\nx = 1\n```\nImproved:\n```python\nx = 2\ny ="
    assert extract_code(completion) == "x = 2\ny ="


def test_indented_code_block_is_not_a_fence() -> None:
    assert extract_code("Example:\n\n    print('indented')\n") is None


def test_indented_block_after_a_fence_does_not_win() -> None:
    completion = "```python\nx = 1\n```\n\nUsage:\n\n    x + 1\n"
    assert extract_code(completion) == "x = 1\n"


def test_empty_and_whitespace_blocks_are_skipped() -> None:
    completion = "```python\nx = 1\n```\n\n```python\n```\n\n```python\n   \n\t\n```\n"
    assert extract_code(completion) == "x = 1\n"


def test_empty_python_block_falls_back_to_another_language() -> None:
    assert extract_code("```bash\nls\n```\n\n```python\n\n```\n") == "ls\n"


def test_only_empty_blocks_is_none() -> None:
    assert extract_code("```python\n```\n~~~\n  \n~~~\n") is None


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "I cannot solve this task.",
        "Use `add(a, b)` to add numbers.",
        "Wrap code like ```this``` in a sentence.",
        "```",
    ],
)
def test_no_fenced_code_is_none(completion: str) -> None:
    assert extract_code(completion) is None


# --- odd input -----------------------------------------------------------------------------


def test_crlf_line_endings_become_newlines() -> None:
    completion = "Here:\r\n```python\r\ndef add(a, b):\r\n    return a + b\r\n```\r\nDone.\r\n"
    assert extract_code(completion) == SOLUTION


def test_nul_becomes_replacement_character() -> None:
    assert extract_code("```python\nx = '\x00'\n```\n") == "x = '\ufffd'\n"


def test_lone_surrogate_is_kept() -> None:
    assert extract_code("```python\nx = '\ud800'\n```\n") == "x = '\ud800'\n"


@pytest.mark.parametrize(
    "prefix",
    [
        "<think>\n" + "Consider the case where `a` is *negative* [see above].\n" * 100_000,
        "[" * 5_000_000,  # inline parsing of this takes minutes
        "*a " * 1_700_000,
    ],
    ids=["long-think", "brackets", "emphasis"],
)
def test_five_megabyte_completion(prefix: str) -> None:
    completion = prefix + "\n</think>\n\n```python\n" + SOLUTION + "```\n"
    assert len(completion) >= 5_000_000
    assert extract_code(completion) == SOLUTION


# --- where the code goes -------------------------------------------------------------------


def test_code_goes_to_the_one_starter_py_file() -> None:
    workspace = {"solution.py": "def add(a, b):\n    ...\n", "README.md": "# add\n"}
    assert files_for(workspace, SOLUTION) == {"solution.py": SOLUTION}


def test_starter_py_file_in_a_subdirectory() -> None:
    workspace = {"src/calc/ops.py": "", "data/input.txt": "1 2\n"}
    assert files_for(workspace, SOLUTION) == {"src/calc/ops.py": SOLUTION}


def test_no_code_is_none_whatever_the_workspace() -> None:
    assert files_for({}, None) is None
    assert files_for({"a.py": "", "b.py": ""}, None) is None


@pytest.mark.parametrize("workspace", [{}, {"README.md": "# add\n", "solution.txt": ""}])
def test_no_starter_py_file_is_an_input_error(workspace: dict[str, object]) -> None:
    with pytest.raises(InputError) as raised:
        files_for(workspace, SOLUTION)
    assert str(raised.value) == (
        "task has no starter .py file to put the code in: "
        "pass an extract function that returns {path: code}"
    )


def test_several_starter_py_files_is_an_input_error() -> None:
    with pytest.raises(InputError) as raised:
        files_for({"c.py": "", "a.py": "", "notes.md": "", "b.py": ""}, SOLUTION)
    assert str(raised.value) == (
        "task has 3 starter .py files (a.py, b.py, c.py): "
        "pass an extract function that returns {path: code}"
    )


def test_many_starter_py_files_are_listed_in_part() -> None:
    workspace = {f"m{i}.py": "" for i in range(7)}
    with pytest.raises(InputError, match=r"7 starter \.py files \(m0\.py, .*m4\.py, and 2 more\)"):
        files_for(workspace, SOLUTION)


def test_dict_from_an_extractor_passes_through() -> None:
    files = {"a.py": "x = 1\n", "b.py": "y = 2\n"}
    assert files_for({"a.py": "", "b.py": ""}, files) is files


@pytest.mark.parametrize(
    ("extracted", "message"),
    [
        ({1: "x = 1\n"}, r"path 1 of type int: paths in \{path: code\} must be str"),
        ({"a.py": b"x = 1\n"}, r"code of type bytes for 'a\.py': code in \{path: code\} must be"),
        ({"a.py": None}, r"code of type NoneType for 'a\.py'"),
    ],
)
def test_bad_dict_is_an_input_error(extracted: dict[Any, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        files_for({"a.py": ""}, extracted)


def test_other_return_type_is_an_input_error() -> None:
    extracted: Any = ["x = 1\n"]
    with pytest.raises(InputError, match="returned a list: it must return the code"):
        files_for({"a.py": ""}, extracted)


def test_extracted_code_lands_in_the_starter_file() -> None:
    workspace = {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"}
    assert files_for(workspace, extract_code(R1_STYLE)) == {"solution.py": SOLUTION}


# --- real model output: usage examples, output blocks, drafts left open in the reasoning ---

SOLUTION = "def add(a, b):\n    return a + b\n"


def test_a_usage_example_after_the_solution_does_not_replace_it() -> None:
    completion = (
        f"Here is the function:\n```python\n{SOLUTION}```\n"
        "Example usage:\n```python\nprint(add(1, 2))  # 3\n```\n"
    )
    assert extract_code(completion, defines={"add"}) == SOLUTION
    assert extract_code(completion) == "print(add(1, 2))  # 3\n"  # no names given: the last


def test_an_untagged_output_block_after_an_untagged_solution_does_not_replace_it() -> None:
    completion = f"```\n{SOLUTION}```\nOutput:\n```\n3\n```\n"
    assert extract_code(completion, defines={"add"}) == SOLUTION


def test_without_a_block_defining_the_names_the_last_python_block_wins() -> None:
    completion = "```python\nx = 1\n```\n```python\ny = 2\n```\n"
    assert extract_code(completion, defines={"add"}) == "y = 2\n"


def test_a_draft_left_open_in_the_reasoning_cannot_swallow_the_answer() -> None:
    completion = (
        "<think>\nLet me try:\n```python\ndef add(a, b):\n    return 0\n"
        f"</think>\nFinal answer:\n```python\n{SOLUTION}```\n"
    )
    assert extract_code(completion) == SOLUTION


def test_an_answer_without_code_after_the_reasoning_falls_back_to_the_whole_text() -> None:
    completion = f"<think>\n```python\n{SOLUTION}```\n</think>\nThe code above is my answer."
    assert extract_code(completion) == SOLUTION


def test_run_groups_default_extract_knows_the_starter_files_names() -> None:
    task = Task.model_validate(
        {
            "task_id": "add-two",
            "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
            "hidden_tests": {"tests/test_add.py": "from solution import add\n"},
            "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
        }
    )
    completion = f"```python\n{SOLUTION}```\nUsage:\n```python\nprint(add(2, 3))\n```\n"
    (request,) = plan(task, "t@v/add-two", [completion], extract_code, "g")
    assert isinstance(request, ExecutionRequest)
    assert request.files == {"solution.py": SOLUTION}


def test_one_completions_ungradable_files_are_its_zero_never_the_groups_error() -> None:
    # Was a break: one completion with a lone surrogate (or an extract that takes a path from
    # the completion, `../x.py`) raised InputError for the whole group: no sample got a result.
    task = Task.model_validate(
        {
            "task_id": "add-two",
            "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
            "hidden_tests": {"tests/test_add.py": "from solution import add\n"},
            "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
        }
    )
    good = f"```python\n{SOLUTION}```"
    surrogate = "```python\ndef add(a, b):\n    return '\ud83d'\n```"
    planned = plan(task, "t@v/add-two", [good, surrogate, "no code"], extract_code, "g")
    assert [type(p).__name__ for p in planned] == [
        "ExecutionRequest", "ExecutionResult", "ExecutionResult"
    ]  # fmt: skip
    bad = planned[1]
    assert isinstance(bad, ExecutionResult)
    assert (bad.status, bad.reward, bad.loss_mask, bad.flags) == (
        Status.SUCCEEDED, 0.0, False, ["invalid_files"]
    )  # fmt: skip
    assert "not valid Unicode" in bad.feedback

    def by_path(completion: str) -> dict[str, str]:
        return {completion: SOLUTION}

    planned = plan(task, "t@v/add-two", ["solution.py", "../up.py"], by_path, "g")
    assert isinstance(planned[0], ExecutionRequest)
    assert isinstance(planned[1], ExecutionResult) and planned[1].flags == ["invalid_files"]


DEEP_BODIES = {
    "unary minus": "x = " + "-" * 3000 + "1",
    "attribute chain": "x = y" + ".a" * 3000,
    "long sum": "x = " + "+".join(["1"] * 3000),
    "nested brackets": "x = " + "[" * 5000 + "]" * 5000,
}


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
def test_code_too_deep_for_the_parser_is_extracted_as_written_and_never_raises(body: str) -> None:
    """Was a break: ast.parse's RecursionError escaped `defined_names`, so one policy's
    completion of 3 KB crashed run_group and every trainer adapter calling it."""
    task = Task.model_validate(
        {
            "task_id": "add-two",
            "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
            "hidden_tests": {"tests/test_add.py": "from solution import add\n"},
            "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
        }
    )
    completion = f"```python\ndef add(a, b):\n    return a + b\n{body}\n```"
    (request,) = plan(task, "t@v/add-two", [completion], extract_code, "g")
    assert isinstance(request, ExecutionRequest)
    assert request.files == {"solution.py": f"def add(a, b):\n    return a + b\n{body}\n"}
