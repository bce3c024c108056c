"""The bundled examples, graded as the README shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPECTED = {
    ("add-two", "correct"): ("succeeded", 1.0),
    ("add-two", "wrong"): ("succeeded", 0.0),
    ("add-two", "syntax-error"): ("succeeded", 0.0),
    ("add-two", "hard-coder"): ("succeeded", 1 / 3),
    ("add-two", "test-tamperer"): ("succeeded", 0.0),
    ("add-two", "timeout"): ("timeout", 0.0),
    ("add-two", "memory-hog"): ("oom", 0.0),
    ("fizzbuzz", "correct"): ("succeeded", 1.0),
    ("fizzbuzz", "off-by-one"): ("succeeded", 0.0),
}


@pytest.mark.alone  # its timeout and memory-hog samples: wall-clock limits decide them
def test_examples_grade_as_documented() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trialbox",
            "sandbox",
            "grade",
            "--tasks",
            str(EXAMPLES / "tasks.jsonl"),
            "--samples",
            str(EXAMPLES / "samples.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    got = {(r["task_id"], r["sample_id"]): (r["status"], r["reward"]) for r in rows}
    assert got == EXPECTED
    assert list(got) == list(EXPECTED)  # input order
    syntax = next(r for r in rows if r["sample_id"] == "syntax-error")
    assert "SyntaxError" in syntax["feedback"]
    assert syntax["feedback"].splitlines()[1].startswith("ERROR tests/test_add.py")
