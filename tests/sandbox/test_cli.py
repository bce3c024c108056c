"""`trialbox sandbox exec` and `trialbox sandbox grade` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.tasks import ADD_TASK, CORRECT


def trialbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trialbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | (env or {}),
    )


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_exec_prints_one_json_object_and_exits_zero_whatever_the_command_did() -> None:
    done = trialbox("sandbox", "exec", "--timeout-s", "5", "--", "sh", "-c", "echo hi; exit 7")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded" and result["exit_code"] == 7
    assert result["stdout"] == "hi\n" and result["signal"] is None
    for key in ("timed_out", "oom_killed", "wall_s", "cpu_s", "peak_memory_mb", "stderr"):
        assert key in result
    assert result["stdout_truncated"] is False and result["stderr_truncated"] is False


def test_exec_usage_errors_exit_two() -> None:
    done = trialbox("sandbox", "exec", "--memory-mb", "0", "--", "true")
    assert done.returncode == 2
    assert "--memory-mb: Input should be greater than or equal to 32" in done.stderr
    assert trialbox("sandbox", "exec").returncode == 2


def test_exec_exits_three_when_the_sandbox_itself_fails() -> None:
    done = trialbox(
        "sandbox", "exec", "--", "true", env={"TRIALBOX_SANDBOX_RUNTIME_DIR": "/nonexistent"}
    )
    assert done.returncode == 3
    assert "no sandbox runtime at /nonexistent" in done.stderr and "make setup" in done.stderr


def test_grade_prints_results_in_input_order(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [ADD_TASK])
    samples = write_jsonl(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "add-two", "sample_id": "good", "files": {"solution.py": CORRECT}},
            {"task_id": "add-two", "sample_id": "starter"},
        ],
    )
    done = trialbox("sandbox", "grade", "--tasks", str(tasks), "--samples", str(samples))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["sample_id"], r["reward"], r["status"]) for r in rows] == [
        ("good", 1.0, "succeeded"),
        ("starter", 0.0, "succeeded"),
    ]
    for key in ("task_id", "loss_mask", "tests_passed", "tests_expected", "feedback"):
        assert key in rows[0]


def test_grade_lists_every_invalid_line_and_runs_nothing(tmp_path: Path) -> None:
    bad_task = dict(ADD_TASK, task_id="bad", limits={"memory_mb": 0})
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [ADD_TASK, bad_task, "{not json"])
    samples = write_jsonl(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "add-two", "sample_id": "a", "files": {"solution.py": 5}},
            {"task_id": "add-two", "sample_id": "b", "colour": "red"},
            {"task_id": "nope", "sample_id": "c"},
        ],
    )
    done = trialbox("sandbox", "grade", "--tasks", str(tasks), "--samples", str(samples))
    assert done.returncode == 2
    assert done.stdout == ""
    for expected in (
        "tasks.jsonl:2: limits.memory_mb: Input should be greater than or equal to 32",
        "tasks.jsonl:3: bad JSON",
        'samples.jsonl:1: files["solution.py"]: a file is a text string',  # the trainer's
        "samples.jsonl:2: colour: unknown field",
        "samples.jsonl:3: task_id: task 'nope' is not in tasks.jsonl",
    ):
        assert expected in done.stderr


def test_grade_scores_a_sample_whose_files_cannot_run_zero_and_grades_the_rest(
    tmp_path: Path,
) -> None:
    # Was a break: a path the policy wrote out of the workspace stopped the whole batch.
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [ADD_TASK])
    samples = write_jsonl(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "add-two", "sample_id": "good", "files": {"solution.py": CORRECT}},
            {"task_id": "add-two", "sample_id": "up", "files": {"../up.py": CORRECT}},
        ],
    )
    done = trialbox("sandbox", "grade", "--tasks", str(tasks), "--samples", str(samples))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["sample_id"], r["status"], r["reward"], r["loss_mask"]) for r in rows] == [
        ("good", "succeeded", 1.0, False),
        ("up", "succeeded", 0.0, False),
    ]
    assert "must stay inside the workspace" in rows[1]["feedback"]
