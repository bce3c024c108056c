"""Decoys for the boundary's equality check (standard library only).

`handle == expected` asks the solution's object twice, about the expected value and about a
decoy, in random order; an object that says yes to both equals anything. That works only if
nothing about the decoy gives it away, so a decoy has the expected value's shape: the same
type, length and key set, the same kind of characters, numbers written with as many digits
and the same sign. It differs in one random place, changed the way a wrong answer would be.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

RNG = random.SystemRandom()
DIGITS = "0123456789"


def decoys(value: Any, count: int, plausible: Sequence[Any] = ()) -> list[Any]:
    """Up to `count` different decoys of `value` ([] when it has none): other values the
    tests use of the same type (`plausible`: an answer from a small set, "Yes" or "No", is
    then no giveaway), and at least one edit of the value or of another edit."""
    found: list[Any] = []

    def add(candidate: Any) -> None:
        if all(candidate != seen or type(candidate) is not type(seen) for seen in found):
            found.append(candidate)

    others = [
        v for v in plausible
        if (value is None or type(v) is type(value)) and v is not None and _differs(v, value)
    ]  # fmt: skip
    for candidate in RNG.sample(others, min(len(others), 4 * count)):
        if len(found) < count - 1:
            add(candidate)
    # Edits of the value or of an edit before, at random: the value is not the one point
    # every edit is one change away from.
    edits = [value]
    for _ in range(4 * count):
        candidate = decoy(RNG.choice(edits))
        if candidate is None:
            break
        if _differs(candidate, value):
            add(candidate)
            edits.append(candidate)
        if len(found) == count:
            break
    return found


def _differs(candidate: Any, value: Any) -> bool:
    try:
        return bool(candidate != value)
    except Exception:
        return False


def decoy(value: Any, depth: int = 0) -> Any:
    """A value unequal to `value` and shaped like it, or None when there is none."""
    if depth > 50:
        return None
    kind = type(value)
    if value is None:
        return RNG.choice((0, "", False, []))
    if kind in (str, bytes, bytearray, list, tuple, dict, set, frozenset) and not value:
        return _filled(kind)  # saying yes only to an empty value is the right answer anyway
    if kind is bool:
        return not value
    if kind is int:
        return _int(value)
    if kind is float:
        return _float(value)
    if kind is complex:
        return complex(_float(value.real), value.imag)
    if kind is str:
        return _text(value)
    if kind in (bytes, bytearray):
        changed = _text(value.decode("latin-1"))
        return None if changed is None else kind(changed.encode("latin-1"))
    if kind in (list, tuple):
        return _sequence(value, depth)
    if kind is dict:
        return _mapping(value, depth)
    if kind in (set, frozenset):
        return _set(value, depth)
    return None


def _filled(kind: type) -> Any:
    item = RNG.randint(0, 9)
    if kind is str:
        return RNG.choice("abcxyz0 ")
    if kind in (bytes, bytearray):
        return kind([item])
    if kind is dict:
        return {item: RNG.randint(0, 9)}
    return kind([item])


def _digit_changed(text: str, positions: list[int]) -> str:
    at = RNG.choice(positions)
    lead = at == positions[0] and len(positions) > 1  # no new leading zero
    new = RNG.choice([d for d in DIGITS if d != text[at] and not (lead and d == "0")])
    return text[:at] + new + text[at + 1 :]


def _int(value: int) -> int:
    text = str(abs(value))
    if len(text) > 300:  # past this a digit is as good as another: change the last ones
        return value + RNG.choice((-1, 1)) * RNG.randint(1, 99)
    changed = int(_digit_changed(text, list(range(len(text)))))
    return -changed if value < 0 else changed


def _float(value: float) -> float:
    if math.isnan(value):
        return 0.0
    if math.isinf(value):
        return -value
    text = repr(value)
    mantissa = text.split("e")[0]
    positions = [i for i, c in enumerate(mantissa) if c.isdigit()]
    first = next(i for i in positions if mantissa[i] != "0") if value else positions[0]
    # The digits a rounding error never touches: from the first significant one on.
    positions = [i for i in positions if i >= first] or positions
    for _ in range(8):
        changed = float(_digit_changed(text, positions))
        if changed != value and math.isfinite(changed):
            return changed
    return value + 1.0


def _class(ch: str) -> tuple[bool, bool, bool]:
    return ch.isalpha(), ch.isdigit(), ch.isupper()


def _alphabet(ch: str, own: set[str]) -> list[str]:
    """Characters of the same kind as `ch`: the value's own first, then its class."""
    same = [c for c in own if c != ch and _class(c) == _class(ch)]
    if same:
        return same
    if ch.isdigit():
        return [c for c in DIGITS if c != ch]
    if ch.isalpha():
        letters = "abcdefghijklmnopqrstuvwxyz"
        letters = letters.upper() if ch.isupper() else letters
        return [c for c in letters if c != ch]
    return [c for c in " .,;:-_!?" if c != ch]


def _text(value: str) -> str:
    at = RNG.randrange(len(value))
    return value[:at] + RNG.choice(_alphabet(value[at], set(value))) + value[at + 1 :]


def _sequence(value: Any, depth: int) -> Any:
    items = list(value)
    for at in RNG.sample(range(len(items)), len(items)):
        changed = decoy(items[at], depth + 1)
        if changed is not None and changed != items[at]:
            items[at] = changed
            return type(value)(items)
    return None  # nothing in it can change


def _mapping(value: dict[Any, Any], depth: int) -> dict[Any, Any] | None:
    keys = list(value)
    for key in RNG.sample(keys, len(keys)):
        changed = decoy(value[key], depth + 1)
        if changed is not None and changed != value[key]:
            return {**value, key: changed}
    return None


def _set(value: Any, depth: int) -> Any:
    items = list(value)
    for item in RNG.sample(items, len(items)):
        changed = decoy(item, depth + 1)
        if changed is not None and changed not in value:
            return type(value)((set(value) - {item}) | {changed})
    return None
