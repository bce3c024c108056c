"""Data contracts shared by the SDK, the Lambdas, the worker and the runner."""

from trialbox.models.common import EncodedFile, FileContent, Files, StrictModel
from trialbox.models.limits import LimitOverrides, Limits
from trialbox.models.report import (
    CommandResult,
    GradingReport,
    Neutralized,
    Provenance,
    RunReport,
    Status,
    TestOutcome,
    TestRecord,
)
from trialbox.models.result import (
    REWARD_RULES,
    ExecutionResult,
    Timings,
    result_for,
    reward_for,
    ungradable,
)
from trialbox.models.sample import ExecutionRequest, Sample, TaskRef
from trialbox.models.task import GradingSpec, Scorer, Task

__all__ = [
    "REWARD_RULES",
    "CommandResult",
    "EncodedFile",
    "ExecutionRequest",
    "ExecutionResult",
    "FileContent",
    "Files",
    "GradingReport",
    "GradingSpec",
    "LimitOverrides",
    "Limits",
    "Neutralized",
    "Provenance",
    "RunReport",
    "Sample",
    "Scorer",
    "Status",
    "StrictModel",
    "Task",
    "TaskRef",
    "TestOutcome",
    "TestRecord",
    "Timings",
    "result_for",
    "reward_for",
    "ungradable",
]
