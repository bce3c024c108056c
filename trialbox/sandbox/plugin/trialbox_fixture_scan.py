"""pytest's fixture scan at a fraction of its cost, with the same findings (the trusted plugin
installs it at import; standard library and pytest only: it runs inside the sandbox runtime).

On every session start, pytest 9 looks for fixtures hidden behind other decorators in every
attribute of every registered plugin (`FixtureManager._check_for_wrapped_fixture`, which
unwraps each one: about 2,000 a session), and warns about each it finds. Almost no attribute
can hide one; skipping those takes a warm fork's grading run of a one-test sample from 43.6 to
40.3 ms median wall, 44.6 to 39.9 ms mean CPU (80 interleaved pairs). Known upstream as
pytest-dev/pytest#14877 (open, with #14885's fix of the same shape, unreleased as of pytest
9.2.0).

Only an object that has a `__wrapped__` chain, or is a `staticmethod` or `classmethod`, can
hide a fixture: for any other the original check unwraps nothing, and finds either the object
itself (a bare fixture, `__wrapped__` set: not this case) or nothing, and warns of neither. So
those are skipped, and every other object gets the original check: the same warnings, for the
same objects, wherever reading an attribute gives the same answer each time. An attribute read
that raises counts as no `__wrapped__`, as the original's unwrap treats it, with one difference
a red team found: a `__wrapped__` that raises a test outcome (`pytest.skip.Exception`) skipped
the module in pytest's scan, and is ignored here (a sample gains nothing by it: the report
flags a skip raised from the solution's code, and warnings do not move a reward).
"""

from __future__ import annotations

from _pytest import fixtures
from _pytest.compat import safe_getattr

_ORIGINAL = vars(fixtures.FixtureManager).get("_check_for_wrapped_fixture")


def _check_for_wrapped_fixture(self: fixtures.FixtureManager, name: str, obj: object) -> None:
    kind = type(obj)
    descriptor = kind is staticmethod or kind is classmethod
    if not descriptor and safe_getattr(obj, "__wrapped__", None) is None:
        return
    _ORIGINAL(self, name, obj)  # type: ignore[misc]


def install() -> None:
    """Once per process; a pytest without the scan (before 9) keeps its own."""
    if (
        _ORIGINAL is not None
        and vars(fixtures.FixtureManager).get("_check_for_wrapped_fixture") is _ORIGINAL
    ):
        fixtures.FixtureManager._check_for_wrapped_fixture = _check_for_wrapped_fixture  # type: ignore[method-assign]
