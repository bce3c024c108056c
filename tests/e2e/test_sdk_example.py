"""The SDK's examples (examples/*.py, shown verbatim in docs/sdk.md and the quickstart in
README.md) run on the local twin and print what the pages say they print."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
SDK_DOC = ROOT / "docs" / "sdk.md"
EXAMPLES = [
    "sdk_quickstart.py",
    # A 5 s timeout decides it: the right sample must finish first (a loaded machine's may not).
    pytest.param("sdk_async.py", marks=pytest.mark.alone),
    "grpo_group.py",
    "multi_turn_agent.py",
]
ANY_ORDER = {"sdk_quickstart.py"}  # it prints results as they arrive


def documented_output(example: Path) -> list[str]:
    """The ```text block that follows the example's code in docs/sdk.md."""
    fences = [t for t in MarkdownIt("commonmark").parse(SDK_DOC.read_text()) if t.type == "fence"]
    code = example.read_text()
    at = next(i for i, t in enumerate(fences) if t.info == "python" and t.content == code)
    following = fences[at + 1]
    assert following.info == "text", f"docs/sdk.md shows no output after {example.name}"
    return following.content.splitlines()


def run(example: Path, cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(example)], cwd=cwd, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_prints_what_the_sdk_page_says(name: str, tmp_path: Path) -> None:
    example = ROOT / "examples" / name
    printed, expected = run(example, cwd=tmp_path), documented_output(example)
    if name in ANY_ORDER:
        printed, expected = sorted(printed), sorted(expected)
    assert printed == expected


def test_the_readme_quotes_the_quickstart_output() -> None:
    expected = documented_output(ROOT / "examples" / "sdk_quickstart.py")
    readme = (ROOT / "README.md").read_text()
    for line in (
        "right succeeded 1.00 all 3 tests passed",
        "hard-coded succeeded 0.33 1/3 tests passed",
    ):
        assert line in expected and f"`{line}`" in readme
