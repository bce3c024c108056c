"""Code extraction: a model's completion (free-form markdown) becomes the files it submits.

`extract_code` is the default extractor: it finds the code in a completion with a CommonMark
parser. `files_for` puts what an extractor returned into the task's workspace. `Extract` is
the type of any extractor; one that returns `{path: code}` places its own files.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from trialbox.errors import InputError

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

__all__ = [
    "NO_CODE_FEEDBACK",
    "NO_CODE_FLAG",
    "Extract",
    "defined_names",
    "extract_code",
    "fenced_blocks",
    "files_for",
]

Extract = Callable[[str], str | dict[str, str] | None]
"""Completion -> its code (str, placed by `files_for`), its files ({path: code}), or None."""

NO_CODE_FEEDBACK = "no code found in the completion"
NO_CODE_FLAG = "no_code"

PYTHON_INFO = frozenset({"python", "py", "python3", "py3"})
"""First word of a fence's info string (lowercased) that marks the block as Python."""


@functools.cache
def _markdown() -> MarkdownIt:
    """Block structure only: fences are block tokens, and skipping inline parsing keeps
    pathological inline input (5 MB of "[" or "*a ") linear and fast. HTML blocks are off so
    a `<think>` line is text: as an HTML block it would swallow the fences that follow it up
    to a blank line. Imported when first used: the Lambda functions import the SDK and never
    extract code (their bundle has no markdown-it)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).disable("inline")


def extract_code(completion: str, defines: Collection[str] = ()) -> str | None:
    """The code in a completion: the last fenced block whose info string starts with a Python
    name (python, py, python3, py3; any case), else the last fenced block of any language
    (or none), else None.

    Two refinements for real model output: when the completion has a `</think>`, the answer
    after the last one is searched first (a draft left open in the reasoning cannot swallow
    it); and with `defines` (the names the task's starter file defines, which `run_group`
    passes), the last block that defines one of them wins over a later usage example.

    CommonMark decides what a fence is: ``` or ~~~, longer fences, fences inside list items
    and blockquotes; indented code blocks do not count, and neither does a block that is
    empty or only whitespace. A fence left open (a completion cut off at max tokens) runs to
    the end of the text. Line endings become \\n and NUL characters become U+FFFD (the
    parser's normalization); the content is otherwise as written.
    """
    if "</think>" in completion:
        found = _extract(completion.rsplit("</think>", 1)[1], defines)
        if found is not None:
            return found
    return _extract(completion, defines)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Each non-blank fenced block of a completion, in order: (the first word of its info
    string, lowercased, or ""; its content). CommonMark decides, as in `extract_code`."""
    if "```" not in text and "~~~" not in text:
        return []  # no fence can open without three backticks or tildes
    blocks = []
    for token in _markdown().parse(text):
        if token.type == "fence" and token.content.strip():
            words = token.info.split(maxsplit=1)
            blocks.append((words[0].lower() if words else "", token.content))
    return blocks


def _extract(text: str, defines: Collection[str]) -> str | None:
    python: list[str] = []
    other: list[str] = []
    for info, content in fenced_blocks(text):
        (python if info in PYTHON_INFO else other).append(content)
    for blocks in (python, other):
        solution = next((b for b in reversed(blocks) if _defines(b, defines)), None)
        if solution is not None:
            return solution
    return python[-1] if python else other[-1] if other else None


def defined_names(code: str) -> set[str]:
    """The top-level functions, classes and assigned names of Python code (none if it does
    not parse). Code nested too deep for the parser (3 KB of `-` or `.a` is enough: a policy
    writes it) raises RecursionError or MemoryError in `ast.parse`: it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _defines(code: str, names: Collection[str]) -> bool:
    return bool(names) and not defined_names(code).isdisjoint(names)


def files_for(
    workspace: Mapping[str, object], extracted: str | dict[str, str] | None
) -> dict[str, str] | None:
    """The files an extractor's output submits: None for no code, a dict as returned (checked
    to be {str: str}), or code placed in the task's one starter `.py` file."""
    if extracted is None:
        return None
    if isinstance(extracted, str):
        return {_starter_path(workspace): extracted}
    if not isinstance(extracted, dict):
        raise InputError(
            f"the extract function returned a {type(extracted).__name__}: "
            "it must return the code (str), {path: code} (dict) or None"
        )
    for path, code in extracted.items():
        if not isinstance(path, str):
            raise InputError(
                f"the extract function returned a path {path!r} of type "
                f"{type(path).__name__}: paths in {{path: code}} must be str"
            )
        if not isinstance(code, str):
            raise InputError(
                f"the extract function returned code of type {type(code).__name__} for "
                f"{path!r}: code in {{path: code}} must be str"
            )
    return extracted


def _starter_path(workspace: Mapping[str, object]) -> str:
    """The task's one starter `.py` file, which receives extracted code."""
    starters = sorted(path for path in workspace if path.endswith(".py"))
    if len(starters) == 1:
        return starters[0]
    fix = "pass an extract function that returns {path: code}"
    if not starters:
        raise InputError(f"task has no starter .py file to put the code in: {fix}")
    more = f", and {len(starters) - 5} more" if len(starters) > 5 else ""
    shown = ", ".join(starters[:5]) + more
    raise InputError(f"task has {len(starters)} starter .py files ({shown}): {fix}")
