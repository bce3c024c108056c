"""The boundary's import hook: a test's imports of the policy's modules, answered by the
policy's process (trialbox_boundary; standard library only).

The policy's modules are never imported in the grader. PolicyModules, first on sys.meta_path,
answers only for the names the runner lists (the workspace's top-level modules that shadow
nothing of the runtime's or the hidden tests'); the module it makes holds the values and
handles the policy's process describes, and asks that process for any other attribute by name.
The hidden tests are read first, never run: the names they bind are never rebound by a star
import, and the values they compare with are the decoys' pool
(trialbox_boundary_handles.PLAUSIBLE).
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import types
from pathlib import Path
from typing import Any

from trialbox_boundary_client import policy
from trialbox_boundary_handles import PLAUSIBLE, refused

POOL_SIZE = 5000  # the hidden tests' literals kept as plausible decoys
LITERAL_CHARS = 10_000


def _literals(tree: ast.AST) -> list[Any]:
    """The plain values the tests compare with or pass: plausible answers, for decoys."""
    found: list[Any] = []
    for node in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call):
            operands = list(node.args)
        for operand in operands:
            try:
                value = ast.literal_eval(operand)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if len(repr(value)) <= LITERAL_CHARS:
                found.append(value)
    return found


def read_tests(root: Path) -> frozenset[str]:
    """Top-level names the hidden test modules bind (a star import never rebinds them); the
    values they compare with go to the decoys' pool."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        if len(PLAUSIBLE) < POOL_SIZE:
            PLAUSIBLE.extend(_literals(tree)[: POOL_SIZE - len(PLAUSIBLE)])
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


class PolicyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the policy's modules, answered by its process."""

    def __init__(self, names: frozenset[str], shadowed: frozenset[str]) -> None:
        self.names = names
        self.shadowed = shadowed | frozenset(dir(builtins))

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] not in self.names:
            return None
        p = policy()
        described = p.ask({"op": "import", "name": fullname})
        if not isinstance(described, dict) or not described.get("found"):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=bool(described["package"]))
        spec.loader_state = described
        return spec

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        described = module.__spec__.loader_state  # type: ignore[union-attr]
        p = policy()
        attrs = described.get("attrs", {})
        for name, doc in attrs.items():
            setattr(module, str(name), p.value(doc))
        # Never a private or dunder name (`__builtins__` would replace the test module's).
        module.__all__ = [  # type: ignore[attr-defined]
            name
            for name in attrs
            if name not in self.shadowed and not name.startswith(("test", "Test", "_"))
        ]
        module_ref = {"$": "ref", "path": [module.__name__], "kind": "module"}

        def __getattr__(name: str) -> Any:
            if refused(name):
                raise AttributeError(name)
            return p.value(p.ask({"op": "getattr", "target": module_ref, "name": name}))

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
