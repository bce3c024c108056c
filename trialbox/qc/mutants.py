"""Mutants of a reference solution, for test strength: each changes one thing the hidden tests
should notice (an operator, a comparison, a constant, a returned value). A test suite that
still passes a mutant cannot tell that program from the reference."""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
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


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every node a mutation applies to, with a description (in source order)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY_SWAPS:
            yield node, f"{type(node.op).__name__} -> {BINARY_SWAPS[type(node.op)].__name__}"
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARE_SWAPS:
            op = type(node.ops[0])
            yield node, f"{op.__name__} -> {COMPARE_SWAPS[op].__name__}"
        elif isinstance(node, ast.BoolOp):
            op_type = type(node.op)
            yield node, f"{op_type.__name__} -> {BOOL_SWAPS[op_type].__name__}"
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            yield node, f"constant {node.value!r} changed"
        elif isinstance(node, ast.Return) and node.value is not None:
            yield node, "returns None"


def _mutate(node: ast.AST) -> None:
    if isinstance(node, ast.BinOp):
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
            node.value = value + 1
    elif isinstance(node, ast.Return):
        node.value = None


def mutants(path: str, source: str, limit: int) -> list[Mutant]:
    """Up to `limit` single-change mutants of one Python file, spread over its sites. A
    file that does not parse has none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    sites = [(i, getattr(n, "lineno", 0), change) for i, (n, change) in enumerate(_sites(tree))]
    if not sites:
        return []
    step = max(1, len(sites) / max(1, limit))
    chosen = [sites[int(k * step)] for k in range(min(limit, len(sites)))]
    found = []
    for index, line, change in chosen:
        copied = copy.deepcopy(tree)
        node = next(n for i, (n, _) in enumerate(_sites(copied)) if i == index)
        _mutate(node)
        mutated = ast.unparse(ast.fix_missing_locations(copied))
        if mutated != ast.unparse(tree):
            found.append(Mutant(path, line, change, mutated + "\n"))
    return found
