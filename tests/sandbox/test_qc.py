"""`trialbox tasks validate` on real sandboxes: good tasks pass; a wrong reference, tests the
starter passes, limits the reference does not fit and wrong expected ids fail; `--write`
fills unset ids; weak tests and leaks are reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.cli import app
from trialbox.models import Task
from trialbox.qc import validate
from trialbox.sandbox.runner import Runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks.jsonl"


def _task(**changes: Any) -> Task:
    return Task.model_validate(ADD_TASK | {"reference": {"solution.py": CORRECT}} | changes)


def _failed(runner: Runner, task: Task) -> set[str]:
    return {
        c.name for c in validate(runner, task, repeats=2, max_mutants=0).problems() if c.failing
    }


def test_a_sound_task_passes_every_check_and_its_mutants_are_scored(runner: Runner) -> None:
    qc = validate(runner, _task(), repeats=2, max_mutants=4)
    assert not qc.failed, qc.problems()
    assert qc.collected == ADD_TASK["grading"]["expected_tests"]
    assert qc.mutants >= 1 and qc.mutation_score == 1.0  # add's tests kill every change
    assert qc.reference_wall_s is not None and qc.reference_wall_s < 10


def test_each_failing_check_names_its_problem(runner: Runner) -> None:
    wrong = _task(reference={"solution.py": "def add(a, b):\n    return a - b\n"})
    assert _failed(runner, wrong) == {"reference"}
    lenient = ADD_TASK["hidden_tests"] | {
        "tests/test_add.py": "from solution import add\ndef test_small():\n    assert True\n"
    }
    trivial = _task(
        hidden_tests=lenient,
        grading=ADD_TASK["grading"] | {"expected_tests": ["tests/test_add.py::test_small"]},
    )
    assert _failed(runner, trivial) == {"starter"}
    slow = _task(reference={"solution.py": "import time\ntime.sleep(30)\n" + CORRECT})
    assert {"limits", "reference"} <= _failed(runner, slow)
    renamed = ADD_TASK["grading"] | {
        "expected_tests": ["tests/test_add.py::test_small", "tests/test_add.py::test_gone"]
    }
    # A test expected but gone scores the reference below 1.0 too; one collected but not
    # expected only fails the ids.
    assert _failed(runner, _task(grading=renamed)) == {"expected_tests", "reference"}
    fewer = ADD_TASK["grading"] | {"expected_tests": ["tests/test_add.py::test_small"]}
    assert _failed(runner, _task(grading=fewer)) == {"expected_tests"}
    no_reference = Task.model_validate(ADD_TASK)
    assert _failed(runner, no_reference) == {"reference"}


def test_leaks_and_test_strength_are_reported_not_failed(runner: Runner) -> None:
    shown = ADD_TASK["hidden_tests"] | {
        "tests/test_add.py": (
            "from solution import add\n"
            "def test_small():\n    assert add(1000, 2000) == 3000\n"
            "def test_negative():\n    assert add(-1, -2) < 0\n"
        )
    }
    task = _task(hidden_tests=shown, prompt="add(a, b): add(1000, 2000) is 3000")
    qc = validate(runner, task, repeats=1, max_mutants=6)
    assert not qc.failed, qc.problems()
    assert qc.leaks == ["1000", "2000", "3000"]
    assert {c.name for c in qc.problems()} == {"leakage"}
    assert qc.mutation_score == 1.0 and qc.mutants >= 1


def test_the_cli_passes_the_examples_and_fills_expected_ids(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    lines = EXAMPLES.read_text().splitlines()
    tasks.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")  # BOM, CRLF
    report = tmp_path / "qc.jsonl"
    args = ["tasks", "validate", str(tasks), "--repeats", "2", "--mutants", "2", "--write"]
    result = CliRunner().invoke(app, [*args, "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "2 of 2 task(s) pass" in result.output
    rows = {
        json.loads(line)["task_id"]: json.loads(line) for line in report.read_text().splitlines()
    }
    assert set(rows) == {"add-two", "fizzbuzz"} and not any(r["failed"] for r in rows.values())
    after = tasks.read_bytes()
    assert after.startswith(b"\xef\xbb\xbf") and after.count(b"\r\n") == len(lines)
    text = after.decode("utf-8-sig").splitlines()
    assert text[0] == lines[0]  # add-two had its ids: byte for byte the same
    written = {json.loads(line)["task_id"]: json.loads(line) for line in text}
    assert written["fizzbuzz"]["grading"]["expected_tests"] == rows["fizzbuzz"]["collected"]
    assert len(rows["fizzbuzz"]["collected"]) == 4


def test_the_cli_exits_1_on_a_failing_task_and_2_on_a_bad_file(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    broken = _task(reference={"solution.py": "def add(a, b):\n    return 0\n"})
    tasks.write_text(broken.model_dump_json() + "\n")
    result = CliRunner().invoke(app, ["tasks", "validate", str(tasks), "--mutants", "0"])
    assert result.exit_code == 1, result.output
    assert "0 of 1 task(s) pass" in result.output and "reference" in result.output
    tasks.write_text('{"task_id": "x"}\n')
    bad = CliRunner().invoke(app, ["tasks", "validate", str(tasks)])
    assert bad.exit_code == 2 and "hidden_tests" in bad.output
