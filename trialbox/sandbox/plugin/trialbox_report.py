"""Trusted pytest plugin, loaded from the sandbox runtime (never from the workspace).

It reports every collected id and every test phase as JSON lines on a pipe the runner passed
in, tagged with a per-run nonce, then appends the grading root to sys.path *after* the
runtime's own paths so no workspace file can shadow pytest, its plugins or the stdlib.

The solution runs in this process, so tampering cannot be made impossible, only hard and
visible: the emitter is bound to each hook as a default argument (a replaced module global
changes nothing), and pytest's reporting internals are fingerprinted at import and compared at
the end of the session. Standard library only: it runs inside the sandbox runtime.
"""

from __future__ import annotations

import builtins
import fnmatch
import json
import os
import sys
import types
from collections.abc import Callable

import _pytest.main
import _pytest.python
import _pytest.reports
import _pytest.runner
import pytest
import trialbox_boundary
import trialbox_fixture_scan
import trialbox_guard

Emit = Callable[[dict[str, object]], None]


def _make_emitter() -> Emit:
    # Read once and scrub from the environment before any workspace code is imported.
    fd = int(os.environ.pop("TRIALBOX_REPORT_FD"))
    nonce_fd = int(os.environ.pop("TRIALBOX_REPORT_NONCE_FD"))
    nonce = os.read(nonce_fd, 256).decode()
    os.close(nonce_fd)

    def emit(event: dict[str, object]) -> None:
        event["nonce"] = nonce
        data = (json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(fd, data) :]

    return emit


_EMIT = _make_emitter()
trialbox_fixture_scan.install()  # before the session's FixtureManager scans the plugins
_FLAGS: set[str] = set()  # integrity findings of the detectors below
_ROOT = os.environ.pop("TRIALBOX_GRADING_ROOT")
# After the runtime's own paths: the hidden tests' helpers, then (in_process) the starter's
# modules, from a directory of their own that holds no test.
sys.path += [_ROOT, os.path.join(_ROOT, ".solution")]
trialbox_guard.install(_ROOT)  # before the builtins are fingerprinted below

MESSAGE_CHARS = 2000
# What a solution would patch to turn failures into passes.
_WATCHED = {
    "TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
    "TestReport.__init__": (_pytest.reports.TestReport, "__init__"),
    "CollectReport.__init__": (_pytest.reports.CollectReport, "__init__"),
    "runner.call_and_report": (_pytest.runner, "call_and_report"),
    "runner.runtestprotocol": (_pytest.runner, "runtestprotocol"),
    "runner.call_runtest_hook": (_pytest.runner, "call_runtest_hook"),
    "runner.CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
    "python.pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
    "python.Function.runtest": (_pytest.python.Function, "runtest"),
    "main.pytest_runtestloop": (_pytest.main, "pytest_runtestloop"),
}
_ORIGINAL = {name: vars(owner).get(attr) for name, (owner, attr) in _WATCHED.items()}


def _message(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    if not report.failed and not report.skipped:
        return None
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = str(crash.message)
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        text = str(longrepr[2])
    else:
        text = report.longreprtext
    return text[-MESSAGE_CHARS:]


def pytest_collectreport(
    report: pytest.CollectReport, _emit: Emit = _EMIT, _flags: set[str] = _FLAGS
) -> None:
    # A module skipped at collection (pytest.skip(allow_module_level=True), from the test or
    # from the solution it imports) ran none of its tests: an error, never a free pass.
    if report.skipped and isinstance(report.longrepr, tuple):
        where = str(report.longrepr[0])
        if where.startswith(os.path.join(_ROOT, ".solution", "")):
            _flags.add(f"framework_tampered: the solution skipped {report.nodeid} at collection")
    if report.failed or report.skipped:
        _emit(
            {
                "event": "collect_error",
                "id": report.nodeid,
                "message": _message(report),
                "skipped": report.skipped,
            }
        )


def pytest_collection_finish(session: pytest.Session, _emit: Emit = _EMIT) -> None:
    _emit({"event": "collected", "ids": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report: pytest.TestReport, _emit: Emit = _EMIT) -> None:
    _emit(
        {
            "event": "test",
            "id": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "wasxfail": hasattr(report, "wasxfail"),
            "duration": report.duration,
            "message": _message(report),
        }
    )


# Hooks through which a plugin decides or rewrites outcomes. A plugin that implements one and
# registers once collection started (workspace code reaching the plugin manager) is
# tampering; conftest files, which register during collection too, are modules by path.
_OUTCOME_HOOKS = (
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_runtest_call",
    "pytest_runtest_protocol",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_collectreport",
    "pytest_collection_modifyitems",
)
_AT_START: set[int] = set()


def pytest_collection(session: pytest.Session) -> None:
    """Before any workspace module is imported: what is registered now is pytest's own, and
    the detectors watch from here on (a solution's code runs at import, during collection)."""
    _AT_START.update(id(p) for p in session.config.pluginmanager.get_plugins())
    _WATCHING[0] = True


def _late_plugins(session: pytest.Session) -> list[str]:
    manager = session.config.pluginmanager
    late = []
    for plugin in manager.get_plugins():
        if id(plugin) in _AT_START or not any(hasattr(plugin, h) for h in _OUTCOME_HOOKS):
            continue
        name = manager.get_name(plugin) or type(plugin).__name__
        if isinstance(plugin, types.ModuleType) and name.endswith("conftest.py"):
            continue  # a conftest (the workspace's are neutralized: these are hidden tests')
        late.append(f"plugin {name!r}")
    return late


# -- detectors for the solution's code in this process (in_process isolation) ------------------
_BUILTINS = {name: id(value) for name, value in vars(builtins).items()}
_FRAMEWORK = ("pytest", "_pytest", "pluggy", "trialbox_")
_MODULES = {name: id(module) for name, module in sys.modules.items() if name.startswith(_FRAMEWORK)}
_TEST_FILES = ("test_*.py", "*_test.py", "conftest.py")
_WATCHING = [False]
_REAL_ROOT = os.path.realpath(_ROOT)
_RUNTIME = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix)})


def _test_file(path: str) -> bool:
    name = os.path.basename(path)
    return path.startswith(_ROOT + os.sep) and any(fnmatch.fnmatch(name, p) for p in _TEST_FILES)


def _opens_test_file(target: object) -> bool:
    """`open`'s path as the kernel resolves it: bytes or str, through /proc/self/cwd, a
    descriptor's link or any other symlink."""
    if not isinstance(target, (str, bytes)):
        return False  # a descriptor: its opening was the event that counted
    try:
        path = os.fsdecode(target)
        if path.startswith(_RUNTIME):  # read-only, no link into the grading tree: imports
            return False
        path = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    if path.startswith(_REAL_ROOT + os.sep):
        path = _ROOT + path[len(_REAL_ROOT) :]
    return _test_file(path)


def _solution_frame() -> str | None:
    """The file of the nearest frame from the grading tree when it is not a test module."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_ROOT + os.sep):
            return None if _test_file(path) else path
        frame = frame.f_back
    return None


def _audit(event: str, args: tuple[object, ...], _flags: set[str] = _FLAGS) -> None:
    if not _WATCHING[0]:
        return
    if event == "open" and _opens_test_file(args[0]):
        who = _solution_frame()
        if who is not None:
            _flags.add(f"test_source_read: {os.path.basename(who)} opened a test file")
    elif event in ("gc.get_referrers", "gc.get_objects", "gc.get_referents"):
        who = _solution_frame()
        if who is not None:
            _flags.add(f"introspection: {os.path.basename(who)} called {event}")


sys.addaudithook(_audit)


def _tampered_runtime() -> list[str]:
    changed = [
        f"builtins.{name}"
        for name, ident in _BUILTINS.items()
        if id(vars(builtins).get(name)) != ident
    ]
    changed += [
        f"sys.modules[{name!r}]"
        for name, ident in _MODULES.items()
        if id(sys.modules.get(name)) != ident
    ]
    real = (builtins, vars(builtins))
    changed += [  # a star import binding `__builtins__` in a test module
        f"{name}.__builtins__"
        for name, module in list(sys.modules.items())
        if _test_file(str(getattr(module, "__file__", None) or ""))
        and not any(vars(module).get("__builtins__") is b for b in real)
    ]
    return changed


_HOOKS = (pytest_collectreport, pytest_collection_finish, pytest_runtest_logreport)
_HOOK_CODE = {hook.__name__: (hook.__code__, hook.__defaults__) for hook in _HOOKS}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int, _emit: Emit = _EMIT) -> None:
    tampered = [
        name
        for name, (owner, attr) in _WATCHED.items()
        if vars(owner).get(attr) is not _ORIGINAL[name]
    ]
    tampered += [
        f"trialbox_report.{hook.__name__}"
        for hook in _HOOKS
        if (hook.__code__, hook.__defaults__) != _HOOK_CODE[hook.__name__]
    ]
    tampered += _late_plugins(session)
    tampered += _tampered_runtime()
    flags = sorted(set(trialbox_boundary.FLAGS) | _FLAGS)
    _emit(
        {
            "event": "finish",
            "exitstatus": int(exitstatus),
            "tampered": tampered,
            "flags": flags,
            "policy_timeout": bool(trialbox_boundary.TIMED_OUT),
        }
    )
