"""The grading phase's pure parts: which workspace files are hijack points, how the grading
command is rewritten, and how the trusted plugin's report is folded into per-test outcomes and
cross-checked against pytest's exit code and the expected ids.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from trialbox.models.integrity import Flag
from trialbox.models.report import Neutralized, TestOutcome, TestRecord
from trialbox.models.task import Task, pytest_args
from trialbox.sandbox.runtime import PLUGIN_MODULE, Runtime

# `test` is the stdlib's own test suite, and also the most common name for a project's tests.
ALWAYS_PROTECTED = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging"})
NOT_PROTECTED = frozenset({"test", "__main__"})
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
PYTEST_CONFIGS = frozenset({"pytest.ini", ".pytest.ini"})
# Left out under the boundary, where it is expected and harmless: never reported as neutralized.
RUNS_APART = "importable code (the solution's code runs in its own process)"
SOLUTION_DIR = ".solution"  # in_process: the starter's modules, appended to sys.path
IMPORTABLE = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd", ".pth")


def protected_modules(runtime: Runtime) -> frozenset[str]:
    """Top-level names a workspace file must not shadow: the stdlib, pytest and its plugins, and
    every package installed in the sandbox runtime."""
    names = set(sys.stdlib_module_names) | ALWAYS_PROTECTED
    for site in runtime.root.glob("lib/python*/site-packages"):
        for entry in site.iterdir():
            if entry.name.endswith((".dist-info", ".egg-info", ".pth")):
                continue
            names.add(entry.name.split(".", 1)[0])
    return frozenset(names - NOT_PROTECTED)


@dataclass(frozen=True)
class HijackFilter:
    """Decides what of the agent's workspace stays out of the grading tree."""

    source: Path
    protected: frozenset[str]
    trusted: frozenset[str]  # paths the task itself provides (starter files, hidden tests)
    # boundary: the policy's code runs in its own process. Either way no importable file of
    # the agent's stays in the tree the tests are collected from; in_process imports the
    # starter's modules from SOLUTION_DIR (`solution_tree`), hijack points reported first.
    boundary: bool = True

    def __call__(self, rel: str, is_dir: bool) -> str | None:
        name = PurePosixPath(rel).name
        importable = not is_dir and name.endswith(IMPORTABLE)
        if self.boundary and importable:
            return RUNS_APART
        reason = self.hijack(rel, is_dir, name)
        return reason if reason is not None or not importable else RUNS_APART

    def solution_tree(self, starter: frozenset[str]) -> Callable[[str, bool], str | None]:
        """in_process: what goes into SOLUTION_DIR: the starter's top-level modules and
        packages (`solution.py`, `pkg/`), less their hijack points."""

        def prune(rel: str, is_dir: bool) -> str | None:
            if PurePosixPath(rel).parts[0] not in starter:
                return "not one of the starter's modules"
            return self.hijack(rel, is_dir, PurePosixPath(rel).name)

        return prune

    def hijack(self, rel: str, is_dir: bool, name: str) -> str | None:
        if is_dir:
            if name == "__pycache__":
                return "bytecode cache"
            if name.endswith((".dist-info", ".egg-info")):
                return "package metadata (entry points could load a pytest plugin)"
            if name in self.protected and _is_regular(self.source / rel / "__init__.py"):
                return f"package shadows the module {name!r}"
            return None
        if name == "conftest.py":
            return "conftest.py can rewrite pytest's behaviour"
        if name in PYTEST_CONFIGS:
            return "pytest config (the grader uses its own)"
        if name in STARTUP_HOOKS or name.endswith(".pth"):
            return "python startup hook"
        if name.endswith((".pyc", ".pyo")):
            return "bytecode"
        if _is_test_module(name) and rel not in self.trusted:
            # The trusted ini's python_files: pytest would collect it next to the hidden
            # tests, in their process, before them (a module that stubs out the tests
            # collected after it needs neither their names nor the answer).
            return "a test module (the hidden tests are the only tests)"
        module = name.split(".", 1)[0]
        # A starter file the task itself named (say `queue.py`) is the agent's to edit.
        if name.endswith((".py", ".so")) and module in self.protected and rel not in self.trusted:
            return f"shadows the module {module!r}"
        return None


def hidden_modules(task: Task) -> frozenset[str]:
    """Top-level names the hidden tests provide (`tests`, a helper module): always theirs."""
    return frozenset(PurePosixPath(p).parts[0].split(".", 1)[0] for p in task.hidden_tests)


def starter_entries(paths: Iterable[str]) -> frozenset[str]:
    """The starter's top-level modules (`solution.py`) and package directories (`pkg`)."""
    tops = set()
    for path in paths:
        parts = PurePosixPath(path).parts
        if len(parts) > 1:
            tops.add(parts[0])
        elif path.endswith((".py", ".so")):
            tops.add(path)
    return frozenset(tops)


def _is_test_module(name: str) -> bool:
    """A file the grader's pytest would collect: `python_files = test_*.py *_test.py`."""
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _is_regular(path: Path) -> bool:
    """lstat only: the runner is root and must not learn where a planted link points."""
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def policy_modules(workspace: Path, protected: frozenset[str]) -> list[str]:
    """The workspace's top-level module names the grader may import from the policy's process:
    never one that shadows the runtime (stdlib, pytest, installed packages). Names only: lstat."""
    names = set()
    for entry in os.scandir(workspace):
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            module = name
        elif name.endswith((".py", ".so")):
            module = name.split(".", 1)[0]
        else:
            continue
        if module.isidentifier() and module not in protected:
            names.add(module)
    return sorted(names)


def grading_argv(command: list[str], runtime: Runtime, root: str) -> list[str]:
    """`python -P -m pytest` with the trusted plugin and config; the task's args come last."""
    return [
        "python",
        "-P",
        "-m",
        "pytest",
        "-p",
        PLUGIN_MODULE,
        "-c",
        str(runtime.pytest_ini),
        f"--rootdir={root}",
        f"--confcutdir={root}",
        *pytest_args(command),
    ]


def grading_env(base: dict[str, str], runtime: Runtime, root: str) -> dict[str, str]:
    """The backend adds TRIALBOX_REPORT_FD once it has opened the report pipe, and the runner
    the descriptor the nonce is read from (never the environment: /proc/self/environ)."""
    return base | {
        "PYTHONPATH": str(runtime.plugin_dir),
        # Only the trusted plugin loads: no entry-point plugins, from the runtime or elsewhere.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "TRIALBOX_GRADING_ROOT": root,
    }


def clean_text(value: str) -> str:
    """Undecodable bytes (non-UTF-8 names, surrogate-escaped text) become U+FFFD."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # lone surrogates outside the escape range
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nonce: str

    @field_validator("*", mode="after")
    @classmethod
    def _clean(cls, value: object) -> object:
        if isinstance(value, str):
            return clean_text(value)
        if isinstance(value, list):
            return [clean_text(v) if isinstance(v, str) else v for v in value]
        return value


class CollectedEvent(_Event):
    event: Literal["collected"]
    ids: list[str]


class CollectErrorEvent(_Event):
    event: Literal["collect_error"]
    id: str = ""  # the session's own collector (say, a missing test path) has the id ""
    message: str | None = None
    skipped: bool = False  # skipped at collection: pytest exits 0 for it, yet its tests failed


class PhaseEvent(_Event):
    event: Literal["test"]
    id: str
    when: Literal["setup", "call", "teardown"]
    outcome: Literal["passed", "failed", "skipped"]
    wasxfail: bool = False
    duration: float = 0.0
    message: str | None = None


class FinishEvent(_Event):
    event: Literal["finish"]
    exitstatus: int
    tampered: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    policy_timeout: bool = False


PluginEvent = Annotated[
    CollectedEvent | CollectErrorEvent | PhaseEvent | FinishEvent, Field(discriminator="event")
]
EVENT = TypeAdapter(PluginEvent)


def fold_phases(phases: dict[str, PhaseEvent]) -> tuple[TestOutcome, float, str | None]:
    """One test's setup/call/teardown reports, as one outcome (pytest's own rules)."""
    setup, call, teardown = (phases.get(w) for w in ("setup", "call", "teardown"))
    duration = round(sum(p.duration for p in phases.values()), 4)
    outcome = TestOutcome.ERROR
    message: str | None = "the test reported no call phase"
    if setup and setup.outcome == "failed":
        outcome, message = TestOutcome.ERROR, setup.message
    elif setup and setup.outcome == "skipped":
        outcome = TestOutcome.XFAILED if setup.wasxfail else TestOutcome.SKIPPED
        message = setup.message
    elif call:
        message = call.message
        if call.outcome == "passed":
            outcome = TestOutcome.XPASSED if call.wasxfail else TestOutcome.PASSED
        elif call.outcome == "skipped":
            outcome = TestOutcome.XFAILED if call.wasxfail else TestOutcome.SKIPPED
        else:
            outcome = TestOutcome.FAILED
    if teardown and teardown.outcome == "failed":
        outcome, message = TestOutcome.ERROR, teardown.message
    return outcome, duration, message


@dataclass
class Collated:
    tests: list[TestRecord]
    expected: list[str]
    anomalies: list[str]
    pytest_exit_code: int | None
    integrity: list[str] = field(default_factory=list)
    policy_timeout: bool = False  # the solution's process ran out of grading time


def collate(
    report: bytes,
    nonce: str,
    expected_tests: list[str] | None,
    hidden_paths: Iterable[str],
    exit_code: int | None,
    overflowed: bool = False,
) -> Collated:
    """Fold the plugin's events into outcomes. Expected ids that never ran are `missing`.

    The report comes from inside the sandbox, so every line is validated: a line without the
    run's nonce is foreign, one with the nonce but the wrong shape is malformed.
    """
    anomalies: list[str] = []
    integrity: list[str] = []
    policy_timeout = False
    phases: dict[str, dict[str, PhaseEvent]] = {}
    collected: list[str] = []
    collect_errors: list[TestRecord] = []
    skipped_modules = 0
    finish: int | None = None
    foreign = malformed = 0
    for line in report.splitlines():
        try:
            raw = json.loads(line)
        except ValueError:
            foreign += 1
            continue
        if not isinstance(raw, dict) or raw.get("nonce") != nonce:
            foreign += 1
            continue
        try:
            event = EVENT.validate_python(raw)
        except ValidationError:
            malformed += 1
            continue
        if isinstance(event, CollectedEvent):
            collected = event.ids
        elif isinstance(event, CollectErrorEvent):
            skipped_modules += event.skipped
            collect_errors.append(
                TestRecord(
                    test_id=event.id or "(collection)",
                    outcome=TestOutcome.ERROR,
                    message=event.message,
                )
            )
        elif isinstance(event, PhaseEvent):
            test = phases.setdefault(event.id, {})
            if event.when in test:
                anomalies.append(f"duplicate_report: {event.id} {event.when}")
            test[event.when] = event
        else:
            if finish is not None:
                anomalies.append("duplicate_report: a second session finish")
            finish = event.exitstatus
            if event.tampered:
                anomalies.append(f"pytest_tampered: {', '.join(event.tampered)} replaced")
                integrity.append(f"{Flag.FRAMEWORK_TAMPERED}: {', '.join(event.tampered)}")
            integrity.extend(event.flags)
            policy_timeout = event.policy_timeout
    if foreign:
        anomalies.append(f"foreign_report_lines: {foreign} line(s) without the run's nonce ignored")
    if malformed:
        anomalies.append(f"malformed_report: {malformed} line(s) with the nonce but a bad shape")
    if overflowed:
        anomalies.append("report_overflow: the plugin's report exceeded its cap")
    if finish is None:
        anomalies.append("session_incomplete: pytest stopped before the end of its session")
        if exit_code is not None and 0 <= exit_code <= 5:  # an exit that looks like pytest's own
            integrity.append(f"{Flag.EARLY_EXIT}: the grader exited {exit_code} mid-session")
    elif exit_code is not None and finish != exit_code:
        anomalies.append(
            f"exit_code_mismatch: pytest reported {finish}, the process exited {exit_code}"
        )
    outcomes = {test_id: fold_phases(test) for test_id, test in phases.items()}
    failures = len(collect_errors) > skipped_modules or any(
        o[0] in (TestOutcome.FAILED, TestOutcome.ERROR) for o in outcomes.values()
    )
    if exit_code == 0 and failures:
        anomalies.append("exit_zero_with_failures: pytest exited 0 although tests failed")
    if exit_code in (1, 2) and not failures:
        # pytest exits 1 (failures) or 2 (collection errors) only when it saw one.
        anomalies.append(f"exit_without_failures: pytest exited {exit_code} but no test failed")

    hidden = set(hidden_paths)
    errors = {record.test_id: record for record in collect_errors}
    if expected_tests is None:
        # A hidden module that failed or was skipped at collection counts as one failed
        # test: its tests are unknown, but leaving them out would raise the pass fraction.
        expected = [i for i in [*collected, *errors] if i.split("::", 1)[0] in hidden]
    else:
        expected = list(expected_tests)
    tests = []
    for test_id in expected:
        if test_id in outcomes:
            outcome, duration, message = outcomes[test_id]
            tests.append(
                TestRecord(test_id=test_id, outcome=outcome, duration_s=duration, message=message)
            )
        elif test_id in errors:
            tests.append(errors[test_id])
        else:
            tests.append(
                TestRecord(test_id=test_id, outcome=TestOutcome.MISSING, message="not run")
            )
    listed = set(expected)
    for test_id, (outcome, duration, message) in outcomes.items():
        if test_id not in listed:
            tests.append(
                TestRecord(test_id=test_id, outcome=outcome, duration_s=duration, message=message)
            )
    tests.extend(record for record in collect_errors if record.test_id not in listed)
    return Collated(tests, expected, anomalies, exit_code, sorted(set(integrity)), policy_timeout)


def neutralized(left_out: list[tuple[str, str]]) -> list[Neutralized]:
    return [
        Neutralized(path=clean_text(path), reason=reason)
        for path, reason in left_out
        if reason != RUNS_APART
    ]
