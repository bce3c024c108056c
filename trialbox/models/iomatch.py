"""`io_match` grading: hidden (input, expected output) cases for stdin/stdout programs, as in
competitive programming. The task names its cases in `grading.io`; the public form is
`{"cases": [{"input": ..., "output": ...}]}`, and the APPS / verl form `{"inputs": [...],
"outputs": [...]}` is accepted too, as are LiveCodeBench's cases (with their `testtype`).

A call-based problem names its function (`fn_name`, as APPS, TACO and PRIME do): each case's
input is the JSON list of the arguments and its output the JSON of the return value. The
program is then a driver that imports `solution.py` (the names of LiveCodeBench's star imports
resolve in it, as builtins, so that only what it binds itself can be called), calls the
function (a method of `Solution` when the module defines that class, as LeetCode's answers are
written) and prints its return value as JSON on a descriptor of its own; the solution's own
prints go to stderr. The grader compares the values: lists and objects item by item, a float
answer within `float_tolerance` (but `exact`), an integer answer exactly, and, as APPS's grader
does, a return value equal to the only item of a one-item expected list passes.

Grading runs one generated pytest module (`TEST_FILE`, the task's only hidden test file, with
one test per case). The cases never sit in a file: the runner hands them to the grader's pytest
on an inherited descriptor, which the module reads once and closes, after making its process
non-dumpable. So the policy's program, run once per case as pytest's child, can read neither a
cases file nor the grader's memory, environment or descriptors. A failing case says its
number and verdict (wrong answer, time limit, runtime error), never its expected output."""

from __future__ import annotations

import json
import keyword
from typing import Any, Literal

from pydantic import Field, model_validator

from trialbox.models.common import StrictModel
from trialbox.models.limits import MAX_TIMEOUT_S

TEST_FILE = "tests/test_io_cases.py"
COMMAND = ["python", "-m", "pytest", "-q", TEST_FILE]
CASES_FD_ENV = "TRIALBOX_CASES_FD"
MAX_CASES = 1000
# A case's share of the default grading timeout: several times what a case takes (a process,
# and for a call the star imports: about 30 ms in a sandbox), so that many cases fit.
CASE_BUDGET_S = 0.25
DEFAULT_PROGRAM = ["python", "solution.py"]


class IoCase(StrictModel):
    input: str
    output: str

    @model_validator(mode="before")
    @classmethod
    def _livecodebench(cls, raw: Any) -> Any:
        """LiveCodeBench's cases carry a `testtype`: `stdin`, or `functional` (one JSON
        argument per line of the input), and may carry `metadata` (read by IoSpec)."""
        if not isinstance(raw, dict) or not {"testtype", "metadata"} & raw.keys():
            return raw
        rest = {k: v for k, v in raw.items() if k not in ("testtype", "metadata")}
        testtype = raw.get("testtype", "stdin")
        if testtype not in ("stdin", "functional"):
            raise ValueError(f"testtype {testtype!r}: stdin or functional")
        if testtype == "functional" and isinstance(rest.get("input"), str):
            try:
                args = [json.loads(line) for line in rest["input"].splitlines() if line.strip()]
            except ValueError as exc:
                raise ValueError(f"a functional case's input line is not JSON: {exc}") from None
            rest["input"] = json.dumps(args)
        return rest


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
        default_factory=lambda: list(DEFAULT_PROGRAM), min_length=1, max_length=32
    )
    fn_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="call-based: the function (or `Solution` method) each case calls, with "
        "the case's input as the JSON list of its arguments",
    )

    @model_validator(mode="before")
    @classmethod
    def _apps_form(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        if not raw.get("fn_name") and isinstance(raw.get("cases"), list):
            raw = raw | {"fn_name": _metadata_function(raw["cases"])}
            functional = any(
                isinstance(c, dict) and c.get("testtype") == "functional" for c in raw["cases"]
            )
            if functional and not raw["fn_name"]:
                raise ValueError(
                    "functional cases are calls: give fn_name, the function they call "
                    "(LiveCodeBench keeps it in the problem's metadata, as func_name)"
                )
        if not raw.get("fn_name"):  # APPS writes "" for a stdin problem
            raw = {k: v for k, v in raw.items() if k != "fn_name"}
        if "cases" in raw or "inputs" not in raw:
            return raw
        inputs, outputs = raw.get("inputs"), raw.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise ValueError("inputs and outputs must be lists")
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        rest = {k: v for k, v in raw.items() if k not in ("inputs", "outputs")}
        if not raw.get("fn_name"):
            cases = [
                {"input": _text(i), "output": _text(o)}
                for i, o in zip(inputs, outputs, strict=True)
            ]
        else:  # APPS stores a call's arguments and return value as values, PRIME as JSON text
            cases = [_call_case(i, o) for i, o in zip(inputs, outputs, strict=True)]
        return rest | {"cases": cases}

    @model_validator(mode="after")
    def _call_cases(self) -> IoSpec:
        if self.fn_name is None:
            return self
        if self.program != DEFAULT_PROGRAM:
            raise ValueError("a call-based spec (fn_name) imports solution.py: remove program")
        if keyword.iskeyword(self.fn_name) or self.fn_name.startswith("__"):
            raise ValueError(f"fn_name {self.fn_name!r} cannot name a solution's function")
        for n, case in enumerate(self.cases):
            try:  # integers parsed as 0: a factorial's digits are no error here
                args = json.loads(case.input, parse_int=lambda _: 0)
                json.loads(case.output, parse_int=lambda _: 0)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"case {n}: a call's input and output are JSON: {exc}") from None
            if not isinstance(args, list):
                raise ValueError(f"case {n}: a call's input is the JSON list of its arguments")
        return self

    def budget_s(self) -> float:
        """The least grading timeout for the cases: each runs as a process of its own."""
        return min(MAX_TIMEOUT_S, CASE_BUDGET_S * len(self.cases))

    def test_ids(self) -> list[str]:
        return [f"{TEST_FILE}::test_case[{n}]" for n in range(len(self.cases))]

    def payload(self) -> bytes:
        """What the grader's pytest reads from CASES_FD_ENV."""
        return self.model_dump_json().encode()


def _text(value: Any) -> Any:
    """A stdin case's input or output as APPS and verl's datasets may store it: text, a list
    of lines (joined), or a number (as text)."""
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _metadata_function(cases: list[Any]) -> str | None:
    """The function LiveCodeBench-style cases name in their `metadata` (`func_name`, in an
    object or its JSON text), as DeepCoder's rows carry it."""
    for case in cases:
        metadata = case.get("metadata") if isinstance(case, dict) else None
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                continue
        name = metadata.get("func_name") if isinstance(metadata, dict) else None
        if isinstance(name, str):
            return name
    return None


def _call_case(args: Any, returned: Any) -> dict[str, Any]:
    """A call's case from APPS's values (the argument list, the return value) or from PRIME's
    text (one JSON argument per line, the return value's JSON)."""
    if isinstance(args, str):
        output = returned if isinstance(returned, str) else json.dumps(returned)
        return {"input": args, "output": output, "testtype": "functional"}
    try:
        return {"input": json.dumps(args if isinstance(args, list) else [args]),
                "output": json.dumps(returned)}  # fmt: skip
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"a call's arguments or return value: {exc}") from None
