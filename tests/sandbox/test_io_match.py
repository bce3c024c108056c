"""io_match grading on both backends: stdin/stdout cases, compared exactly, by tokens or with a
float tolerance, a time limit per case, feedback that never shows an expected output, and
hidden cases the policy's program cannot reach (no file, environment, descriptor or memory of
the grader's holds them where it can read)."""

from __future__ import annotations

import math
import secrets
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from trialbox.models import Task
from trialbox.models.iomatch import TEST_FILE
from trialbox.models.result import ExecutionResult
from trialbox.models.sample import Sample
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

# Every case's output: a program that finds it anywhere passes. Made at run time, so that no
# file holds it (under rlimit the program sees the host's /tmp, where a checkout may be).
SECRET = "expected-" + secrets.token_hex(8)


def _task(io: dict[str, Any], **grading: Any) -> Task:
    return Task.model_validate(
        {
            "task_id": "io",
            "workspace": {"solution.py": ""},
            "grading": {"scorer": "io_match", "io": io, **grading},
            "limits": {"timeout_s": 30},
        }
    )


SUM = _task({"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7\n", "30\n"]})
SUM_CODE = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def backend(request: pytest.FixtureRequest) -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": request.param}))


def _grade(runner: Runner, task: Task, code: str) -> ExecutionResult:
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": code})
    return score(task.grading, runner.run(task, sample))


def test_each_case_is_a_test_and_the_reward_is_the_fraction_passed(backend: Runner) -> None:
    assert _grade(backend, SUM, SUM_CODE).reward == 1.0
    off = "a, b = map(int, input().split())\nprint(a + b + (a == 3))\n"
    result = _grade(backend, SUM, off)
    assert (result.status, result.reward, result.loss_mask) == ("succeeded", 2 / 3, False)
    assert [t.message for t in result.tests if t.outcome != "passed"] == [
        "Failed: case 1: wrong answer"
    ]


def test_crashes_and_slow_cases_fail_with_their_verdict(runner: Runner) -> None:
    crash = _grade(runner, SUM, "import sys\nsys.exit('boom')\n")
    assert crash.reward == 0.0
    assert crash.tests[0].message == "Failed: case 0: runtime error (exit code 1) boom"
    slow_task = _task(SUM.grading.io.model_dump() | {"case_timeout_s": 0.5})  # type: ignore[union-attr]
    slow = _grade(runner, slow_task, "import time\ntime.sleep(5)\n")
    assert slow.reward == 0.0 and "time limit exceeded (0.5 s)" in (slow.tests[0].message or "")


def test_compare_modes(runner: Runner) -> None:
    spaced = "a, b = map(int, input().split())\nprint(' ', a + b, ' \\n')\n"
    assert _grade(runner, SUM, spaced).reward == 1.0  # whitespace: the same tokens
    exact = _task(SUM.grading.io.model_dump() | {"compare": "exact"})  # type: ignore[union-attr]
    assert _grade(runner, exact, spaced).reward == 0.0
    assert _grade(runner, exact, SUM_CODE).reward == 1.0
    ratio = _task({"cases": [{"input": "1 3\n", "output": "0.333333333 ok\n"}],
                   "compare": "float", "float_tolerance": 1e-6})  # fmt: skip
    close = "a, b = map(int, input().split())\nprint(a / b, 'ok')\n"
    assert _grade(runner, ratio, close).reward == 1.0
    far = "a, b = map(int, input().split())\nprint(round(a / b, 3), 'ok')\n"
    assert _grade(runner, ratio, far).reward == 0.0
    nan = "print('nan ok')\n"
    assert _grade(runner, ratio, nan).reward == 0.0


HUNT = f"""
import glob, os, stat, sys
marker = {SECRET[:9]!r} + {SECRET[9:]!r}  # built at run time: this file never holds it whole
def look(path):
    try:
        if stat.S_ISFIFO(os.stat(path).st_mode):
            return  # a pipe of its own (its stdout, through its parent's fds) would block
        with open(path, 'rb') as f:
            if marker.encode() in f.read(50_000_000):
                print(marker)
                sys.exit(0)
    except Exception:
        pass
parent = os.getppid()
for path in glob.glob(f'/proc/{{parent}}/*') + glob.glob(f'/proc/{{parent}}/fd/*'):
    look(path)
try:  # the grader's memory, region by region
    with open(f'/proc/{{parent}}/maps') as maps, open(f'/proc/{{parent}}/mem', 'rb') as mem:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split('-'))
            try:
                mem.seek(start)
                if marker.encode() in mem.read(min(end - start, 1 << 26)):
                    print(marker)
                    sys.exit(0)
            except Exception:
                pass
except Exception:
    pass
for root in ('.', '/tmp', os.environ.get('HOME', '/'), '/dev/shm'):
    for path in glob.glob(os.path.join(root, '**'), recursive=True):
        look(path)
for fd in range(3, 64):
    try:
        data = os.read(fd, 1 << 20)
        if marker.encode() in data:
            print(marker)
            sys.exit(0)
    except OSError:
        pass
print('not found')
"""


def test_the_program_cannot_reach_the_hidden_outputs(backend: Runner) -> None:
    # One case, time enough for the whole hunt: it ends printing "not found".
    task = _task({"cases": [{"input": "x\n", "output": SECRET + "\n"}], "case_timeout_s": 20})
    result = _grade(backend, task, HUNT)
    assert result.reward == 0.0, result.feedback
    assert [t.message for t in result.tests] == ["Failed: case 0: wrong answer"]
    shown = result.model_dump_json()
    assert SECRET not in shown  # no result field carries an expected output


def test_the_apps_form_and_bad_specs() -> None:
    assert SUM.grading.expected_tests == [f"{TEST_FILE}::test_case[{n}]" for n in range(3)]
    assert Task.model_validate_json(SUM.model_dump_json()) == SUM  # the job spec round trip
    with pytest.raises(ValidationError, match="2 inputs but 1 outputs"):
        _task({"inputs": ["1\n", "2\n"], "outputs": ["1\n"]})
    with pytest.raises(ValidationError, match="JSON list of its arguments"):
        _task({"cases": [{"input": "{}", "output": "1"}], "fn_name": "f"})
    with pytest.raises(ValidationError, match="remove program"):
        _task({"inputs": [[1]], "outputs": [[1]], "fn_name": "f", "program": ["python", "x.py"]})
    with pytest.raises(ValidationError, match="fn_name"):
        _task({"inputs": [[1]], "outputs": [[1]], "fn_name": "os.system"})
    with pytest.raises(ValidationError, match="testtype"):
        _task({"cases": [{"input": "1", "output": "1", "testtype": "interactive"}]})
    assert (
        _task({"inputs": ["1\n"], "outputs": ["1\n"], "fn_name": ""}).grading.io
        == _task({"cases": [{"input": "1\n", "output": "1\n"}]}).grading.io
    )  # APPS writes fn_name "" for a stdin problem
    with pytest.raises(ValidationError, match=r"needs grading\.io"):
        _task(None)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="remove hidden_tests"):
        Task.model_validate(
            SUM.model_dump() | {"hidden_tests": {"tests/test_x.py": "def test_x(): pass\n"}}
        )
    with pytest.raises(ValidationError, match=r"remove grading\.command"):
        _task({"cases": [{"input": "", "output": ""}]}, command=["pytest", "-q"])
    with pytest.raises(ValidationError, match='needs scorer "io_match"'):
        Task.model_validate(
            SUM.model_dump()
            | {"grading": {"command": ["pytest"], "io": {"cases": [{"input": "", "output": ""}]}}}
        )


# Call-based problems, as APPS, TACO and PRIME store them: a case's input is the JSON list of
# the arguments, its output the JSON of the return value (APPS wraps it in a one-item list).
CALLS = _task(
    {
        "fn_name": "pair_sum",
        "inputs": [[[1, 2, 3], 4], [[5], 5], [[], 0]],
        "outputs": [[[0, 2]], [[]], [[]]],
    }
)
PAIR_SUM = """
def pair_sum(nums, target):
    seen = {}
    for i, n in enumerate(nums):
        if target - n in seen:
            return [seen[target - n], i]
        seen[n] = i
    return []
"""


def test_a_call_based_problem_calls_the_function_with_each_case(backend: Runner) -> None:
    assert _grade(backend, CALLS, PAIR_SUM).reward == 1.0
    # LeetCode's form: a Solution method; typing and collections names unimported, as
    # LeetCode's and LiveCodeBench's graders allow; its prints do not touch the answer.
    leetcode = """
class Solution:
    def pair_sum(self, nums: List[int], target: int) -> List[int]:
        print("debug", nums)
        seen: Dict[int, int] = defaultdict(int)
        for i, n in enumerate(nums):
            if target - n in seen:
                return (seen[target - n], i)
            seen[n] = i
        return []
"""
    result = _grade(backend, CALLS, leetcode)
    assert result.reward == 1.0, result.feedback
    wrong = _grade(backend, CALLS, "def pair_sum(nums, target):\n    return [0, 2]\n")
    assert wrong.reward == 1 / 3
    assert [t.message for t in wrong.tests if t.outcome != "passed"] == [
        "Failed: case 1: wrong answer",
        "Failed: case 2: wrong answer",
    ]
    missing = _grade(backend, CALLS, "def other():\n    pass\n")
    assert missing.reward == 0.0
    assert "defines no function" in (missing.tests[0].message or ""), missing.tests[0].message
    odd = _grade(backend, CALLS, "def pair_sum(nums, target):\n    return {1, 2}\n")
    assert odd.reward == 0.0 and "not JSON serializable" in (odd.tests[0].message or "")


def test_a_call_compares_values(runner: Runner) -> None:
    def task(output: Any, **io: Any) -> Task:
        return _task({"fn_name": "f", "inputs": [[]], "outputs": [output], **io})

    def reward(t: Task, returned: str) -> float | None:
        return _grade(runner, t, f"def f():\n    return {returned}\n").reward

    assert reward(task([0.1 + 0.2]), "0.3") == 1.0  # floats within float_tolerance
    assert reward(task([0.1 + 0.2], compare="exact"), "0.3") == 0.0
    assert reward(task([1, 2]), "1") == 0.0  # only a one-item list is unwrapped
    assert reward(task([1, 2]), "(1, 2)") == 1.0  # a tuple is the list it dumps as
    assert reward(task([True]), "1") == 0.0  # True is no number
    assert reward(task(["3"]), "3") == 0.0
    assert reward(task({"a": [1]}), "{'a': [1.0]}") == 1.0
    assert reward(task([3]), "3.0") == 1.0  # an integer answer, exactly
    numpyish = "type('Int64', (), {'tolist': lambda self: 3})()"  # numpy's scalars do so
    assert reward(task([3]), numpyish) == 1.0
    assert reward(task([999999937]), "999999000.0") == 0.0  # no tolerance for an integer
    assert reward(task([1000000]), "2000001 / 2") == 0.0


def test_a_call_finds_only_what_the_solution_defines(runner: Runner) -> None:
    # The star imports give a solution math's factorial: it must not earn an empty answer.
    task = _task({"fn_name": "factorial", "inputs": ["5", "3"], "outputs": ["120", "6"]})
    empty = _grade(runner, task, "")
    assert empty.reward == 0.0
    assert "solution.py defines no function 'factorial'" in (empty.tests[0].message or "")
    assert _grade(runner, task, "from math import factorial\n").reward == 1.0  # its own import
    listed = _task({"fn_name": "count", "inputs": [[1]], "outputs": [0]})
    assert _grade(runner, listed, "class Solution(list):\n    pass\n").reward == 0.0


def test_a_call_takes_int_keys_and_returns_huge_integers(runner: Runner) -> None:
    keyed = _task({"fn_name": "f", "inputs": [[{"1": 2, "3": 4}]], "outputs": [[6]]})
    assert _grade(runner, keyed, "def f(d):\n    return d[1] + d[3]\n").reward == 1.0  # as PRIME
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        digits = str(math.factorial(1700))  # over Python's 4300 digits
    finally:
        sys.set_int_max_str_digits(limit)
    huge = _task({"fn_name": "f", "inputs": ["1700"], "outputs": [digits]})
    code = "def f(n):\n    return factorial(n)\n"
    assert _grade(runner, huge, code).reward == 1.0


def test_bad_call_specs_are_refused() -> None:
    functional = [{"input": "1", "output": "1", "testtype": "functional"}]
    with pytest.raises(ValidationError, match="functional cases are calls: give fn_name"):
        _task({"cases": functional})
    with pytest.raises(ValidationError, match="cannot name a solution's function"):
        _task({"fn_name": "__init__", "inputs": [[1]], "outputs": [1]})
    with pytest.raises(ValidationError, match="cannot name a solution's function"):
        _task({"fn_name": "class", "inputs": [[1]], "outputs": [1]})
    deep = "[" * 3000 + "]" * 3000
    with pytest.raises(ValidationError, match="case 0"):
        _task({"fn_name": "f", "cases": [{"input": "[]", "output": deep}]})
    with pytest.raises(ValidationError, match="remove isolation"):
        _task({"inputs": ["1\n"], "outputs": ["1\n"]}, isolation="in_process")


def test_many_cases_get_time_enough() -> None:
    # Each case is a process: a fixed timeout would fail a right answer on a big case set.
    few, many = (
        _task({"inputs": ["1"] * 10, "outputs": ["1"] * 10}),
        _task({"inputs": ["1"] * 400, "outputs": ["1"] * 400}),
    )
    assert (few.grading_timeout_s, many.grading_timeout_s) == (30, 100)
    assert (
        _task({"inputs": ["1"] * 400, "outputs": ["1"] * 400}, timeout_s=5).grading_timeout_s == 5
    )


def test_livecodebench_functional_cases_are_calls(runner: Runner) -> None:
    task = _task(
        {
            "fn_name": "join",
            "cases": [
                {"input": '"ab"\n3', "output": '"ababab"', "testtype": "functional"},
                {"input": '"x"\n0', "output": '""', "testtype": "functional"},
            ],
        }
    )
    code = "class Solution:\n    def join(self, s: str, k: int) -> str:\n        return s * k\n"
    assert _grade(runner, task, code).reward == 1.0
    # DeepCoder's rows name the function in each case's metadata.
    metadata = {"func_name": "join"}
    rows = [
        {"input": '"ab"\n3', "output": '"ababab"', "testtype": "functional", "metadata": metadata},
        {"input": '"x"\n0', "output": '""', "testtype": "functional", "metadata": metadata},
    ]
    assert _task({"cases": rows}).grading.io == task.grading.io


def test_prime_stores_a_calls_arguments_as_json_lines(runner: Runner) -> None:
    # verl's prime_code rows: each input one JSON argument per line, each output JSON text.
    task = _task({"fn_name": "pair_sum", "inputs": ["[1, 2, 3]\n4", "[5]\n5"],
                  "outputs": ["[0, 2]", "[]"]})  # fmt: skip
    assert task.grading.io is not None
    assert [c.input for c in task.grading.io.cases] == ["[[1, 2, 3], 4]", "[[5], 5]"]
    assert _grade(runner, task, PAIR_SUM).reward == 1.0


def test_a_call_cannot_reach_the_hidden_return_values(backend: Runner) -> None:
    # The hunt, run inside the called function: it returns what it found.
    hunter = (
        "import contextlib, io\n"
        "def f():\n"
        "    found = io.StringIO()\n"
        "    with contextlib.redirect_stdout(found), contextlib.suppress(SystemExit):\n"
        f"        exec({HUNT!r}, {{}})\n"
        "    return found.getvalue().strip()\n"
    )
    task = _task({"fn_name": "f", "inputs": [[]], "outputs": [SECRET], "case_timeout_s": 20})
    result = _grade(backend, task, hunter)
    assert result.reward == 0.0, result.feedback
    assert [t.message for t in result.tests] == ["Failed: case 0: wrong answer"]
    assert SECRET not in result.model_dump_json()
