"""The raw run report: what the sandbox observed. The scorer turns it into a reward."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from trialbox.models.common import StrictModel
from trialbox.models.limits import Limits
from trialbox.models.performance import PerformanceReport


class Status(StrEnum):
    SUCCEEDED = "succeeded"
    TIMEOUT = "timeout"
    OOM = "oom"
    INTEGRITY_VIOLATION = "integrity_violation"
    REJECTED = "rejected"
    SANDBOX_ERROR = "sandbox_error"
    CANCELLED = "cancelled"


class CommandResult(StrictModel):
    """One command as the sandbox saw it. Under bwrap a signal death reads as exit 128+N."""

    phase: Literal["agent", "grading", "exec"]
    argv: list[str]
    status: Status
    exit_code: int | None = Field(description="null when the runner killed it with a signal")
    signal: str | None = Field(description="known for the runner's own kills; else null")
    timed_out: bool
    oom_killed: bool
    wall_s: float
    cpu_s: float
    peak_memory_mb: float
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool


class TestOutcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"
    MISSING = "missing"


class TestRecord(StrictModel):
    __test__ = False  # not a pytest test class

    test_id: str
    outcome: TestOutcome
    duration_s: float | None = None
    message: str | None = None


class Neutralized(StrictModel):
    path: str
    reason: str


class GradingReport(StrictModel):
    """The grading phase: per-test outcomes from the trusted plugin, cross-checked."""

    command: list[str] = Field(description="the command as the runner rewrote it")
    pytest_exit_code: int | None
    tests: list[TestRecord] = Field(description="expected tests first, then the rest reported")
    expected_tests: list[str]
    expected_tests_unknown: bool
    neutralized: list[Neutralized]
    anomalies: list[str] = Field(description="disagreements between the plugin and pytest")
    performance: PerformanceReport | None = Field(
        default=None, description="the performance scorer's measurements"
    )
    integrity: list[str] = Field(
        default_factory=list,
        description="the integrity detectors' findings, `flag: detail` (trialbox.models.integrity)",
    )


class Provenance(StrictModel):
    runner_version: str
    backend: Literal["bwrap", "rlimit"]
    runtime_version: str
    runtime_hash: str
    limits: Limits
    grading_timeout_s: float | None = None


class RunReport(StrictModel):
    schema_version: Literal[1] = 1
    task_id: str
    sample_id: str
    status: Status = Field(description="succeeded, timeout, oom or sandbox_error")
    commands: list[CommandResult]
    grading: GradingReport | None
    notes: list[str] = Field(default_factory=list)
    error: str | None = Field(default=None, description="why the sandbox failed, if it did")
    checkpoint: str | None = Field(default=None, description="the workspace after the commands")
    provenance: Provenance | None
