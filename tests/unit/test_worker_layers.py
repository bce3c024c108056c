"""The worker's modules point one way: the loop uses the job runner, the sessions and the
checkpoint I/O; none of those reaches back up into the loop, and the sessions do not reach
into the job runner (a review found run.py importing the loop's RunJob, and sessions.py the
runner's checkpoint I/O)."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "trialbox" / "worker"


def imports() -> dict[str, set[str]]:
    """Each worker module's imports of other worker modules (by short name)."""
    found: dict[str, set[str]] = {}
    for path in sorted(WORKER.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "trialbox.worker."
            ):
                names.add(node.module.rsplit(".", 1)[1])  # type: ignore[union-attr]
        found[path.stem] = names
    return found


def test_the_worker_modules_import_no_cycle() -> None:
    graph = imports()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for name in graph.get(start, set()):
            if name == goal or (name not in seen and reaches(name, goal, seen | {name})):
                return True
        return False

    assert [name for name in graph if reaches(name, name, set())] == []


def test_nothing_below_the_loop_imports_it_and_sessions_do_not_import_the_job_runner() -> None:
    graph = imports()
    assert sorted(name for name, uses in graph.items() if "loop" in uses) == ["__main__"]
    assert "run" not in graph["sessions"]


def test_sessions_and_adapters_use_the_clients_context_not_its_private_parts() -> None:
    """Was a gap (issue 24's review): sessions read `client._aws`, `_session_io()` and
    `_open_sessions`, and the adapters `aio._aws`. They have `client.sessions` (a
    SessionContext) and `client.region` now."""
    root = WORKER.parents[1]
    reached = []
    for path in [
        root / "trialbox/sdk/sessions.py",
        *sorted((root / "trialbox/integrations").glob("*.py")),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in (
                "_aws",
                "_session_io",
                "_open_sessions",
            ):
                reached.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert reached == []
