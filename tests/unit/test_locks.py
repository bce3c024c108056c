"""The locks we ship agree with what they lock: every pin hashed, the worker's lock equal to the
package's own dependencies, every direct requirement in its lock."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from infra.locks import pins

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {
    "sandbox_image/worker.lock": "sandbox_image/worker.in",
    "sandbox_image/requirements.txt": "sandbox_image/requirements.in",
    "functions/requirements.lock": "functions/requirements.in",
}


def hashed_pins(lock: str) -> dict[str, int]:
    """Each pin of a lock and how many --hash lines follow it."""
    counts: dict[str, int] = {}
    current = None
    for line in lock.splitlines():
        if pinned := pins(line):
            ((name, version),) = pinned.items()
            current = f"{name}=={version}"
            counts[current] = 0
        elif current and line.strip().startswith("--hash=sha256:"):
            counts[current] += 1
    return counts


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_of_a_lock_has_its_hashes(lock: str) -> None:
    counts = hashed_pins((ROOT / lock).read_text())
    assert counts and all(counts.values()), {pin: n for pin, n in counts.items() if not n}


@pytest.mark.parametrize(("lock", "source"), sorted(LOCKS.items()))
def test_every_direct_requirement_is_in_its_lock_at_its_pin(lock: str, source: str) -> None:
    wanted, locked = pins((ROOT / source).read_text()), pins((ROOT / lock).read_text())
    assert wanted and {name: locked.get(name) for name in wanted} == wanted


def test_the_image_worker_lock_is_the_package_s_own_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pins("\n".join(project["project"]["dependencies"]))
    declared |= pins("\n".join(project["build-system"]["requires"]))
    assert pins((ROOT / "sandbox_image/worker.in").read_text()) == declared


def test_the_checker_catches_an_unhashed_pin() -> None:
    assert hashed_pins("a==1 \\\n    --hash=sha256:00\nb==2\n") == {"a==1": 1, "b==2": 0}
