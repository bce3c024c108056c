"""Equality that holds for anything, caught in process (`grading.isolation: in_process`;
standard library only).

In process, a test compares the solution's object itself (`assert f(x) == y`), so no wire
can ask a decoy. Instead every class the solution's code defines gets its `__eq__` and
`__ne__` checked: when one says a plain value (a number, a string, a container of them) is
equal, it is asked again about a decoy shaped like that value (trialbox_decoy); equal to both
is flagged `always_equal`, and the comparison answers unequal.

A class counts as the solution's when the code that defines it comes from the starter's
directory (`.solution/`) or from no file at all (`exec` of a string). Defence in depth: code
that runs in this process can still get around it, and the other detectors watch for that.
"""

from __future__ import annotations

import builtins
import os
import sys
from collections.abc import Callable
from typing import Any

import trialbox_boundary
import trialbox_decoy

_PLAIN = (int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)
_ORIGINAL_BUILD = builtins.__build_class__
_SOLUTION_DIRS: list[str] = []
DECOYS = 3


def _truthy(value: Any) -> bool:
    try:
        return bool(value)
    except Exception:  # an array's elementwise answer: not a claim of equality
        return False


def _asked(cls: type, claims: Callable[[Any], bool], other: Any) -> bool | None:
    """Whether the object claims equality with `other`, asked in random order among decoys
    (None: no decoy, ask it plainly); equal to `other` and to a decoy is flagged and False."""
    if type(other) not in _PLAIN:
        return None
    questions = [other, *trialbox_decoy.decoys(other, DECOYS)]
    if len(questions) == 1:
        return None
    answers = {}
    for i in trialbox_decoy.RNG.sample(range(len(questions)), len(questions)):
        try:
            answers[i] = claims(questions[i])
        except Exception:
            if i == 0:  # the test's own question: its error is the test's to see
                raise
            answers[i] = False
    real = answers.pop(0)
    if real and any(answers.values()):
        name = getattr(cls, "__qualname__", "object")
        trialbox_boundary.FLAGS.append(f"always_equal: a {name} from the solution equals anything")
        return False
    return real


def _checked_eq(cls: type, original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        claimed = _asked(cls, lambda v: _truthy(original(self, v)), other)
        return original(self, other) if claimed is None else claimed

    return __eq__


def _checked_ne(cls: type, original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def __ne__(self: Any, other: Any) -> Any:
        def claims(value: Any) -> bool:
            answer = original(self, value)
            return answer is not NotImplemented and not _truthy(answer)

        claimed = _asked(cls, claims, other)
        return original(self, other) if claimed is None else not claimed

    return __ne__


def _solutions(filename: str) -> bool:
    if filename.startswith(tuple(_SOLUTION_DIRS)):
        return True
    return not filename.startswith("<frozen") and not os.path.isfile(filename)


def _build_class(func: Any, name: str, *bases: Any, **kwargs: Any) -> Any:
    cls = _ORIGINAL_BUILD(func, name, *bases, **kwargs)
    try:
        defined_by_solution = _solutions(sys._getframe(1).f_code.co_filename)
        if defined_by_solution and isinstance(cls, type):
            for attr, check in (("__eq__", _checked_eq), ("__ne__", _checked_ne)):
                original = vars(cls).get(attr)
                if callable(original):
                    type.__setattr__(cls, attr, check(cls, original))
    except Exception:  # a class that refuses the change keeps its own (and stays visible)
        pass
    return cls


def install(root: str) -> None:
    """From here on, classes the solution defines have their equality checked."""
    _SOLUTION_DIRS.append(os.path.join(root, ".solution", ""))
    builtins.__build_class__ = _build_class  # type: ignore[assignment]
