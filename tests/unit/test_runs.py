"""The main job's files: what `trialbox run` may resume into."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialbox.runs import is_result_file


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
