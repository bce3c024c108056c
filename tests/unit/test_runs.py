"""The main job's files: what `trialbox run` may resume into."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialbox.runs import RunJob, is_result_file


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("", True),
        ('{"request_id": "r1", "status": "succeeded"}\n', True),
        ('{"request_id": "r1", "status": "succeeded"}\n{"request_id": "r2", "sta', True),
        ("hello world\n", False),
        ("hello world", False),
        ('{"request_id": "r1", "status": "succeeded"}\nnotes\n', False),
    ],
)
def test_only_a_results_file_may_be_resumed_into(tmp_path: Path, text: str, ok: bool) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(text)
    assert is_result_file(out) is ok


def test_a_resume_after_the_in_process_twin_timed_out_drops_the_short_timeout(
    tmp_path: Path,
) -> None:
    """The twin ends with the run and drops the samples in flight: the same short --timeout
    would drop them again, so the resume command runs with the default."""
    job = RunJob(tmp_path / "t.jsonl", tmp_path / "s.jsonl", tmp_path / "o.jsonl", timeout_s=5)
    job.run_id = "r"
    assert "--timeout" in job.resume_command()
    job.twin_started = True
    assert "--timeout" not in job.resume_command()
