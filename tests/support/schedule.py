"""How `make test` spreads the suite over xdist workers: by group, slowest first.

A group is one test module, except where modules share a session fixture too costly to build
on every worker (tests/fargate: the image, a twin and the worker container as Fargate runs it;
its longest module pays for its own). A group runs whole on one worker, so module and package
fixtures are built once per group.

Groups start in order of their recorded time, longest first: the long ones overlap everything
else instead of running alone at the end. The times are those of the last run on this machine
(per test, kept outside the checkout), else tests/durations.json, the seed: per group, from
that record after a full run on 2 cores (`python -m tests.support.schedule` writes it). A test
neither knows counts DEFAULT_S.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trialbox.sandbox.shared_files import exclusive, publish

SHARED = ("tests/fargate/",)  # packages that run as one group
# ... but for modules long enough to pay for those fixtures themselves (its red-team corpus
# and 164 HumanEval jobs, about half the package's time), run beside the rest.
ALONE = ("tests/fargate/test_grading_integrity.py", "tests/fargate/test_humaneval_worker.py")
SEED = Path(__file__).parents[1] / "durations.json"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trialbox"
RECORD = CACHE / "test-durations.json"
DEFAULT_S = 1.0


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in ALONE:
        return module
    return next((package for package in SHARED if module.startswith(package)), module)


def _load(path: Path) -> dict[str, float]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in found.items()} if isinstance(found, dict) else {}


@dataclass
class Known:
    """What a run knows of the suite's times: this machine's record, per node id, and the
    seed, per group. The xdist controller reads them once and hands them to every worker:
    workers must collect in one order, whatever another run writes meanwhile."""

    record: dict[str, float] = field(default_factory=dict)
    seed: dict[str, float] = field(default_factory=dict)

    @classmethod
    def read(cls) -> Known:
        return cls(_load(RECORD), _load(SEED))

    def cost(self, group: str, nodeids: list[str]) -> float:
        if any(n in self.record for n in nodeids):
            return sum(self.record.get(n, DEFAULT_S) for n in nodeids)
        return self.seed.get(group, DEFAULT_S * len(nodeids))


def alone(item: pytest.Item) -> bool:
    """Marked to take every seat of the machine (tests/support/seats.py)."""
    return item.get_closest_marker("alone") is not None


def slowest_groups_first(items: list[pytest.Item], known: Known) -> None:
    """Reorder `items` in place: whole groups, longest first; within a group, as collected
    (a stable sort: a group's tests are contiguous as collected, and stay so), except that a
    module's tests marked `alone` run last in it, one after the other: they then drain the
    machine's seats once, not once each."""
    members: defaultdict[str, list[str]] = defaultdict(list)
    for item in items:
        members[group_of(item.nodeid)].append(item.nodeid)
    cost = {group: known.cost(group, nodeids) for group, nodeids in members.items()}
    first: dict[str, int] = {}  # each module's place in the collection
    for index, item in enumerate(items):
        first.setdefault(_module(item), index)
    items.sort(key=lambda item: (-cost[group_of(item.nodeid)], first[_module(item)], alone(item)))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def by_group(spent: dict[str, float]) -> dict[str, float]:
    """Seconds per node id summed per group."""
    groups: defaultdict[str, float] = defaultdict(float)
    for nodeid, seconds in spent.items():
        groups[group_of(nodeid)] += seconds
    return {group: round(seconds, 1) for group, seconds in sorted(groups.items())}


def _dump(durations: dict[str, float]) -> bytes:
    return (json.dumps(durations, indent=0, sort_keys=True) + "\n").encode()


def record(spent: dict[str, float], path: Path = RECORD) -> None:
    """Merge these tests' times (setup, call and teardown) into the record: one process at a
    time (every xdist worker records its own), the file written whole."""
    if not spent:
        return
    with exclusive(path.with_name(f".{path.name}.lock")):
        publish(path, _dump(_load(path) | {k: round(v, 3) for k, v in spent.items()}))


def main() -> None:
    """`python -m tests.support.schedule`: the seed from this machine's record."""
    publish(SEED, _dump(by_group(_load(RECORD))))


if __name__ == "__main__":
    main()
