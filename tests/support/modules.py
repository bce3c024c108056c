"""A module loaded from a file that is not on the path (a script, a sandbox plugin)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def from_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
