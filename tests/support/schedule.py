"""How `make test` spreads the suite over xdist workers: by group, slowest first.

A group is one test module, except where modules share a session fixture too costly to build
on every worker (tests/fargate: the image, a twin and the worker container as Fargate runs it).
A group runs whole on one worker, so module and session fixtures are built once per group.

Groups start in order of their recorded time, longest first: the long ones overlap everything
else instead of running alone at the end. The times are those of the last run on this machine
(kept outside the checkout), else tests/durations.json, the seed a run on 2 cores wrote; a
test neither knows counts DEFAULT_S.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

SHARED = ("tests/fargate/",)  # packages that run as one group
SEED = Path(__file__).parents[1] / "durations.json"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trialbox"
RECORD = CACHE / "test-durations.json"
DEFAULT_S = 1.0


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return next((package for package in SHARED if module.startswith(package)), module)


def _load(path: Path) -> dict[str, float]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in found.items()} if isinstance(found, dict) else {}


def known_durations() -> dict[str, float]:
    """Seconds per node id: the seed, overridden by this machine's last runs."""
    return _load(SEED) | _load(RECORD)


def slowest_groups_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder `items` in place: whole groups, longest first; within a group, as collected
    (a stable sort: a group's tests are contiguous as collected, and stay so)."""
    cost: dict[str, float] = defaultdict(float)
    for item in items:
        cost[group_of(item.nodeid)] += durations.get(item.nodeid, DEFAULT_S)
    items.sort(key=lambda item: -cost[group_of(item.nodeid)])


def record(durations: dict[str, float]) -> None:
    """Merge this run's times (setup, call and teardown per test) into the machine's record,
    written whole or not at all: two runs may finish at once."""
    if not durations:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    merged = _load(RECORD) | {k: round(v, 3) for k, v in durations.items()}
    partial = RECORD.with_name(f"{RECORD.name}.{os.getpid()}")
    partial.write_text(json.dumps(merged, indent=0, sort_keys=True))
    partial.replace(RECORD)
