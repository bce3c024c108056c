"""How each smoke script ends: its problems on stderr, one verdict line, the exit code. The
scripts run by their paths (each in its framework's venv), so they import this by name."""

from __future__ import annotations

import sys


def report(name: str, problems: list[str]) -> int:
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    print(f"{name}: " + ("FAILED" if problems else "passed"))
    return 1 if problems else 0
