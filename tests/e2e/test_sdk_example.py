"""The README's Python example is a file the tests run, so it stays true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sdk_quickstart.py"


def test_the_readme_shows_the_example_verbatim() -> None:
    assert f"```python\n{EXAMPLE.read_text()}```" in (ROOT / "README.md").read_text()


def test_the_sdk_example_runs_and_prints_what_the_readme_says() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["right succeeded 1.0", "hard-coded succeeded 0.5"]
    readme = (ROOT / "README.md").read_text()
    assert "`right succeeded 1.0` and `hard-coded succeeded 0.5`" in readme
