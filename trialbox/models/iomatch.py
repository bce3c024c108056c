"""`io_match` grading: hidden (input, expected output) cases for stdin/stdout programs, as in
competitive programming. The task names its cases in `grading.io`; the public form is
`{"cases": [{"input": ..., "output": ...}]}`, and the APPS / verl form `{"inputs": [...],
"outputs": [...]}` is accepted too.

Grading runs one generated pytest module (`TEST_FILE`, the task's only hidden test file, with
one test per case). The cases never sit in a file: the runner hands them to the grader's pytest
on an inherited descriptor, which the module reads once and closes, after making its process
non-dumpable. So the policy's program, run once per case as pytest's child, can read neither a
cases file nor the grader's memory, environment or descriptors. A failing case says its
number and verdict (wrong answer, time limit, runtime error), never its expected output."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trialbox.models.common import StrictModel

TEST_FILE = "tests/test_io_cases.py"
COMMAND = ["python", "-m", "pytest", "-q", TEST_FILE]
CASES_FD_ENV = "TRIALBOX_CASES_FD"
MAX_CASES = 1000


class IoCase(StrictModel):
    input: str
    output: str


class IoSpec(StrictModel):
    cases: list[IoCase] = Field(min_length=1, max_length=MAX_CASES)
    compare: Literal["exact", "whitespace", "float"] = Field(
        default="whitespace",
        description="exact: the same text; whitespace: the same tokens; float: the same "
        "tokens, numbers within float_tolerance (relative or absolute)",
    )
    float_tolerance: float = Field(default=1e-6, gt=0, le=1)
    case_timeout_s: float = Field(default=2.0, gt=0, le=60, description="wall clock, per case")
    program: list[str] = Field(
        default_factory=lambda: ["python", "solution.py"], min_length=1, max_length=32
    )

    @model_validator(mode="before")
    @classmethod
    def _apps_form(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or "cases" in raw or "inputs" not in raw:
            return raw
        if raw.get("fn_name"):
            raise ValueError(
                "call-based problems (fn_name) are not io_match tasks: grade them with a "
                "hidden pytest file that calls the function"
            )
        inputs, outputs = raw.get("inputs"), raw.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise ValueError("inputs and outputs must be lists of strings")
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        rest = {k: v for k, v in raw.items() if k not in ("inputs", "outputs", "fn_name")}
        cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
        return rest | {"cases": cases}

    def test_ids(self) -> list[str]:
        return [f"{TEST_FILE}::test_case[{n}]" for n in range(len(self.cases))]

    def payload(self) -> bytes:
        """What the grader's pytest reads from CASES_FD_ENV."""
        return self.model_dump_json().encode()


# The generated test module. It holds no case: they arrive on the descriptor.
TEST_MODULE = '''"""io_match: each case runs the program on its input (trialbox.models.iomatch)."""
import ctypes
import json
import math
import os
import subprocess

import pytest

ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE 0: no child can read this process
with os.fdopen(int(os.environ.pop("TRIALBOX_CASES_FD")), "rb") as _channel:
    _SPEC = json.loads(_channel.read())
_CASES = _SPEC["cases"]


def _numbers_close(got, want):
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    tolerance = _SPEC["float_tolerance"]
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=tolerance, abs_tol=tolerance):
            return False
    return True


def _same(got, want):
    if _SPEC["compare"] == "exact":
        return got == want
    if _SPEC["compare"] == "whitespace":
        return got.split() == want.split()
    return _numbers_close(got, want)


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_case(case):
    limit = _SPEC["case_timeout_s"]
    try:
        run = subprocess.run(
            _SPEC["program"],
            input=_CASES[case]["input"].encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"case {case}: time limit exceeded ({limit} s)", pytrace=False)
    except OSError as exc:
        pytest.fail(f"case {case}: the program could not start ({exc})", pytrace=False)
    if run.returncode != 0:
        last = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        pytest.fail(
            f"case {case}: runtime error (exit code {run.returncode}) {last[0][:300]}",
            pytrace=False,
        )
    if not _same(run.stdout.decode(errors="replace"), _CASES[case]["output"]):
        pytest.fail(f"case {case}: wrong answer", pytrace=False)
'''
