"""The pytest module an `io_match` task grades with (trialbox.models.iomatch): one test per
case, the cases read from an inherited descriptor, the program run once per case (for a
call-based case, `_DRIVER`), and the comparisons. It is the task's one hidden test file."""

# The generated test module. It holds no case: they arrive on the descriptor.
TEST_MODULE = '''"""io_match: each case runs the program on its input (trialbox.models.iomatch)."""
import ctypes
import json
import math
import os
import subprocess
import sys

import pytest

# The program must not read this process (its memory holds every case). Behind the isolation
# boundary (trialbox_boundary: its subprocess.run) it runs in the policy's process, as the
# agent's uid, which can reach nothing of this one. Otherwise it is this process's child, of
# its uid: where the kernel has Landlock, each run gets a domain of its own (_unreachable),
# and a process in a domain can reach (ptrace, /proc/<pid>/mem, fd, environ) none outside it.
# Either way this process stays dumpable, so the rlimit backend's memory watchdog (no
# CAP_SYS_PTRACE) sees its descriptors. Only without either does it make itself undumpable,
# which the watchdog charges all of the machine's shared-memory growth: it cannot see in.
_LIBC = ctypes.CDLL(None, use_errno=True)
_LANDLOCK_CREATE_RULESET, _LANDLOCK_RESTRICT_SELF = 444, 446  # the same on x86_64 and arm64
_ACCESS_FS_MAKE_BLOCK = 1 << 11  # a right no program needs: the domain is what matters
_CHILD = subprocess.run.__module__ == "subprocess"  # not the boundary's
_LANDLOCK = _CHILD and _LIBC.syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1) >= 1  # its ABI


def _unreachable():
    """In the program's process before it starts: a Landlock domain of its own."""
    handled = ctypes.c_uint64(_ACCESS_FS_MAKE_BLOCK)
    ruleset = _LIBC.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(handled), 8, 0)
    if (
        ruleset < 0
        or _LIBC.prctl(38, 1, 0, 0, 0) != 0  # PR_SET_NO_NEW_PRIVS, as Landlock requires
        or _LIBC.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0
    ):
        raise OSError(ctypes.get_errno(), "no Landlock domain for the program")
    os.close(ruleset)


if _CHILD and not _LANDLOCK:
    _LIBC.prctl(4, 0)  # PR_SET_DUMPABLE 0: no child can read this process
sys.set_int_max_str_digits(0)  # a call's answer may be a factorial
with os.fdopen(int(os.environ.pop("TRIALBOX_CASES_FD")), "rb") as _channel:
    _SPEC = json.loads(_channel.read())
_CASES = _SPEC["cases"]


def _numbers_close(got, want):
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    tolerance = _SPEC["float_tolerance"]
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=tolerance, abs_tol=tolerance):
            return False
    return True


def _same(got, want):
    if _SPEC["fn_name"]:
        return _returned(got, want)
    if _SPEC["compare"] == "exact":
        return got == want
    if _SPEC["compare"] == "whitespace":
        return got.split() == want.split()
    return _numbers_close(got, want)


def _returned(got, want):
    try:
        value = json.loads(got)
    except ValueError:
        return False
    expected = json.loads(want)
    if _equal(value, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(value, expected[0])


def _equal(got, want):
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            _equal(g, w) for g, w in zip(got, want)
        )
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(
            _equal(got[k], want[k]) for k in want
        )
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        if _SPEC["compare"] == "exact" or not isinstance(want, float):
            return got == want  # an integer answer is exact: 3.0 passes, 1e9 for 999999937 not
        tolerance = _SPEC["float_tolerance"]
        return math.isclose(got, want, rel_tol=tolerance, abs_tol=tolerance)
    return type(got) is type(want) and got == want


# A call-based case's program: the function's return value, as JSON, on fd 1 as it was; the
# solution's own prints go to stderr.
_DRIVER = r"""
import builtins, importlib.util, json, os, sys
sys.setrecursionlimit(6 * 10**5)  # as PRIME's grader (verl's prime_code)
sys.set_int_max_str_digits(0)  # an answer may be a factorial
args = json.loads(sys.stdin.read())
if args and isinstance(args[0], dict):  # as PRIME: JSON's string keys back to int keys
    try:
        args[0] = {int(k): v for k, v in args[0].items()}
    except ValueError:
        pass
result = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
# LiveCodeBench's star imports, as builtins of the solution's module: its names resolve, yet
# its namespace holds only what solution.py binds.
given = {}
exec(
    "from string import *\\nfrom re import *\\nfrom datetime import *\\n"
    "from collections import *\\nfrom heapq import *\\nfrom bisect import *\\n"
    "from copy import *\\nfrom math import *\\nfrom random import *\\n"
    "from statistics import *\\nfrom itertools import *\\nfrom functools import *\\n"
    "from operator import *\\nfrom io import *\\nfrom sys import *\\nfrom json import *\\n"
    "from typing import *\\n"
    "import string, re, datetime, collections, heapq, bisect, copy, math, random\\n"
    "import statistics, itertools, functools, operator, io, typing, sys, json\\n",
    given,
)
given.pop("__builtins__", None)
spec = importlib.util.spec_from_file_location("solution", "solution.py")
module = importlib.util.module_from_spec(spec)
module.__dict__["__builtins__"] = given | vars(builtins)
sys.modules["solution"] = module
spec.loader.exec_module(module)
name = sys.argv[1]
holder = module.__dict__.get("Solution")
own = [k for k in getattr(holder, "__mro__", ()) if k.__module__ == "solution"]
if isinstance(holder, type) and any(name in vars(k) for k in own):
    function = getattr(holder(), name)
elif name in module.__dict__:
    function = module.__dict__[name]
else:  # math's factorial, say, found by the star imports, earns nothing
    sys.exit(f"NameError: solution.py defines no function {name!r}")
returned = function(*args)


def plain(value):  # numpy's scalars and arrays, as APPS's == would take them
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


json.dump(returned, result, default=plain)
result.close()
"""


def _program():
    if _SPEC["fn_name"]:
        return ["python", "-c", _DRIVER, _SPEC["fn_name"]]
    return _SPEC["program"]


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_case(case):
    limit = _SPEC["case_timeout_s"]
    try:
        run = subprocess.run(
            _program(),
            input=_CASES[case]["input"].encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=limit,
            **({"preexec_fn": _unreachable} if _LANDLOCK else {}),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"case {case}: time limit exceeded ({limit} s)", pytrace=False)
    except OSError as exc:
        pytest.fail(f"case {case}: the program could not start ({exc})", pytrace=False)
    if run.returncode != 0:
        last = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        pytest.fail(
            f"case {case}: runtime error (exit code {run.returncode}) {last[0][:300]}",
            pytrace=False,
        )
    if not _same(run.stdout.decode(errors="replace"), _CASES[case]["output"]):
        pytest.fail(f"case {case}: wrong answer", pytrace=False)
'''
