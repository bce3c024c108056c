"""Mutants of a reference solution, for test strength: each changes one thing the hidden tests
should notice (an operator, a comparison, a constant, a returned value). A test suite that
still passes a mutant cannot tell that program from the reference."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

BINARY_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
BOOL_SWAPS: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    path: str  # the reference file changed
    line: int
    change: str  # what changed, for the report
    source: str


def _is_main_guard(node: ast.AST) -> bool:
    """`__name__ == "__main__"`: flipping it only runs the script at import."""
    return isinstance(node, ast.Compare) and any(
        isinstance(part, ast.Name) and part.id == "__name__"
        for part in (node.left, *node.comparators)
    )


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every node a mutation applies to, with a description, in source order."""
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in BINARY_SWAPS:
            found.append(
                (node, f"{type(node.op).__name__} -> {BINARY_SWAPS[type(node.op)].__name__}")
            )
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARE_SWAPS:
            if not _is_main_guard(node):
                op = type(node.ops[0])
                found.append((node, f"{op.__name__} -> {COMPARE_SWAPS[op].__name__}"))
        elif isinstance(node, ast.BoolOp):
            op_type = type(node.op)
            found.append((node, f"{op_type.__name__} -> {BOOL_SWAPS[op_type].__name__}"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            found.append((node, f"constant {node.value!r} changed"))
        elif isinstance(node, ast.Return) and not _returns_none(node):
            found.append((node, "returns None"))
    found.sort(key=lambda site: (getattr(site[0], "lineno", 0), getattr(site[0], "col_offset", 0)))
    return found


def _returns_none(node: ast.Return) -> bool:
    return node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)


def _mutate(node: ast.AST) -> None:
    if isinstance(node, ast.BinOp | ast.AugAssign):
        node.op = BINARY_SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[0] = COMPARE_SWAPS[type(node.ops[0])]()
    elif isinstance(node, ast.BoolOp):
        node.op = BOOL_SWAPS[type(node.op)]()
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            node.value = not value
        elif isinstance(value, int | float):
            node.value = value + 1 if value + 1 != value else value * 2 + 1
    elif isinstance(node, ast.Return):
        node.value = None


def _parse(source: str) -> ast.AST | None:
    try:
        return ast.parse(source.lstrip("\ufeff"))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _mutant(tree: ast.AST, path: str, index: int, change: str) -> Mutant | None:
    copied = copy.deepcopy(tree)
    node = _sites(copied)[index][0]
    line = getattr(node, "lineno", 0)
    _mutate(node)
    try:
        mutated = ast.unparse(ast.fix_missing_locations(copied))
    except (ValueError, RecursionError):
        return None
    return None if mutated == ast.unparse(tree) else Mutant(path, line, change, mutated + "\n")


def mutants(path: str, source: str, limit: int) -> list[Mutant]:
    """Up to `limit` single-change mutants of one Python file, spread over its sites. A
    file that does not parse has none."""
    return all_mutants({path: source}, limit)


def all_mutants(files: dict[str, str], limit: int) -> list[Mutant]:
    """Up to `limit` single-change mutants over the Python files, spread evenly over all their
    sites (a change that alters nothing is skipped for the next)."""
    sites = []
    trees = {}
    for path, source in files.items():
        tree = _parse(source) if path.endswith(".py") else None
        if tree is not None:
            trees[path] = tree
            sites += [(path, i, change) for i, (_, change) in enumerate(_sites(tree))]
    if not sites or limit <= 0:
        return []
    step = len(sites) / min(limit, len(sites))
    order = [int(k * step) for k in range(min(limit, len(sites)))]
    order += [i for i in range(len(sites)) if i not in set(order)]  # spares, for no-op sites
    found: list[Mutant] = []
    for index in order:
        if len(found) == limit:
            break
        path, site, change = sites[index]
        made = _mutant(trees[path], path, site, change)
        if made is not None:
            found.append(made)
    return found
