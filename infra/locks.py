"""Reading the pins of our lock and requirement files (`make lock` writes the locks), by
normalized distribution name. No CDK import: tests/unit reads locks with it too."""

from __future__ import annotations

import re

_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)", re.MULTILINE)


def normal(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """Every `name==version` line of a requirements or lock file."""
    return {normal(name): version for name, version in _PIN.findall(text)}
