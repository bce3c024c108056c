"""A task: the prompt, starter files, hidden tests and how to grade them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trialbox.models import iomatch
from trialbox.models.common import Files, Identifier, Metadata, StrictModel, refuse_unsupported
from trialbox.models.integrity import Action, Flag
from trialbox.models.iomatch import IoSpec
from trialbox.models.iomatch_module import TEST_MODULE
from trialbox.models.limits import Limits
from trialbox.models.performance import PerformanceSpec

PYTEST_PREFIXES: tuple[tuple[str, ...], ...] = (("python", "-m", "pytest"), ("pytest",))

# Options that would let a task move pytest's config, plugins or report away from the runner's
# trusted ones. Tasks never name a report path: the runner's plugin is the only report.
FORBIDDEN_PYTEST_OPTIONS = (
    "-p",
    "-c",
    "--config-file",
    "--rootdir",
    "--confcutdir",
    "-o",
    "--override-ini",
    "--junitxml",
    "--junit-xml",
    "--junit-prefix",
    "--report-log",
    "--resultlog",
    "--result-log",
    "--basetemp",
    "--import-mode",
    "--pyargs",
    "--noconftest",
    "--debug",
    "--pdb",
    "--pdbcls",
    "--trace",
)


# Short options whose value follows in the same argument ("-rfE", "-kexpr"): scanning stops there.
_SHORT_WITH_VALUE = frozenset("kmrWn")


def _short_cluster_forbidden(arg: str) -> bool:
    """True for "-p..." and clusters such as "-qpfoo" that hide a forbidden short option."""
    if not arg.startswith("-") or arg.startswith("--"):
        return False
    for letter in arg[1:]:
        if f"-{letter}" in FORBIDDEN_PYTEST_OPTIONS:
            return True
        if letter in _SHORT_WITH_VALUE or not letter.isalpha():
            return False
    return False


class Isolation(StrEnum):
    """Where the policy's code runs at grading (docs/sandbox.md, "The boundary")."""

    BOUNDARY = "boundary"  # its own process as the agent's uid; values cross a data-only wire
    IN_PROCESS = "in_process"  # imported into the grader's pytest, guarded by the detectors


class Scorer(StrEnum):
    TESTS_PASS_FRACTION = "tests_pass_fraction"
    ALL_OR_NOTHING = "all_or_nothing"
    IO_MATCH = "io_match"  # the fraction of `grading.io` cases passed (trialbox.models.iomatch)
    WEIGHTED_TESTS = "weighted_tests"  # the expected tests passed, weighted by `grading.weights`
    PERFORMANCE = "performance"  # the pass fraction x speed (x memory) against the reference


def pytest_args(command: list[str]) -> list[str]:
    """The arguments after `python -m pytest` or `pytest`; raises for any other command form."""
    for prefix in PYTEST_PREFIXES:
        if tuple(command[: len(prefix)]) == prefix:
            return command[len(prefix) :]
    raise ValueError(
        'the grading command must be ["python", "-m", "pytest", ARGS...] or ["pytest", ARGS...]'
    )


class GradingSpec(StrictModel):
    command: list[str] = Field(min_length=1)
    scorer: Scorer = Scorer.TESTS_PASS_FRACTION
    io: IoSpec | None = Field(default=None, description="io_match: the hidden cases")
    expected_tests: list[str] | None = Field(
        default=None, description="pytest node ids relative to the grading root"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=3600, description="defaults to limits.timeout_s"
    )
    isolation: Isolation = Field(
        default=Isolation.BOUNDARY,
        description="boundary: the policy's code runs in its own process and the tests see "
        "its values and handles; in_process: for tests that need its objects themselves",
    )
    weights: dict[str, float] | None = Field(
        default=None, description="weighted_tests: a weight (> 0) per test id; others weigh 1"
    )
    performance: PerformanceSpec | None = Field(
        default=None, description="performance: the workload timed against the reference"
    )
    integrity: dict[Flag, Action] = Field(
        default_factory=dict,
        description="per flag, `violation` (the default for every flag: status "
        "integrity_violation, reward 0, no loss) or `flag` (reported, scored as usual)",
    )

    @model_validator(mode="before")
    @classmethod
    def _io_defaults(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("scorer") == Scorer.IO_MATCH:
            return {"command": iomatch.COMMAND} | raw
        return raw

    @model_validator(mode="after")
    def _scorer_fields(self) -> GradingSpec:
        if (self.scorer == Scorer.WEIGHTED_TESTS) != (self.weights is not None):
            raise ValueError('grading.weights goes with scorer "weighted_tests", and only with it')
        if self.weights is not None:
            if not self.weights or any(not 0 < w < float("inf") for w in self.weights.values()):
                raise ValueError("grading.weights: each weight must be a finite number over 0")
            unknown = set(self.weights) - set(self.expected_tests or self.weights)
            if unknown:
                raise ValueError(f"grading.weights names tests not expected: {sorted(unknown)}")
        if (self.scorer == Scorer.PERFORMANCE) != (self.performance is not None):
            raise ValueError('grading.performance goes with scorer "performance", and only with it')
        return self

    def timeout_for(self, limit_s: float) -> float:
        """The grading timeout under a limit of `limit_s`: `timeout_s` if set, else the limit,
        or more for an io_match task's many cases (each a process of its own)."""
        if self.timeout_s is not None:
            return self.timeout_s
        return max(limit_s, self.io.budget_s()) if self.io is not None else limit_s

    @model_validator(mode="after")
    def _io_match(self) -> GradingSpec:
        if self.scorer != Scorer.IO_MATCH:
            if self.io is not None:
                raise ValueError('grading.io needs scorer "io_match"')
            return self
        if self.io is None:
            raise ValueError('scorer "io_match" needs grading.io: the hidden cases')
        if self.command != iomatch.COMMAND:
            raise ValueError("io_match runs its own grading command: remove grading.command")
        if self.isolation == Isolation.IN_PROCESS:
            raise ValueError("io_match runs the program as its own process: remove isolation")
        ids = self.io.test_ids()
        if self.expected_tests is None:
            self.expected_tests = ids
        elif self.expected_tests != ids:
            raise ValueError("io_match names its own expected tests: remove expected_tests")
        return self

    @field_validator("command")
    @classmethod
    def _pytest_only(cls, command: list[str]) -> list[str]:
        for arg in pytest_args(command):
            name = arg.split("=", 1)[0]
            if name in FORBIDDEN_PYTEST_OPTIONS or _short_cluster_forbidden(arg):
                raise ValueError(
                    f"grading option {arg!r} is not allowed: the runner sets pytest's config, "
                    "plugins and report itself"
                )
        return command

    @field_validator("expected_tests")
    @classmethod
    def _node_ids(cls, ids: list[str] | None) -> list[str] | None:
        if ids is None:
            return None
        if not ids:
            raise ValueError("must list at least one test id, or be null to use collected tests")
        if len(set(ids)) != len(ids):
            raise ValueError("test ids must be unique")
        for test_id in ids:
            if "::" not in test_id or test_id.startswith("/"):
                raise ValueError(
                    f"{test_id!r} is not a pytest node id such as 'tests/test_x.py::test_name'"
                )
        return ids


class Task(StrictModel):
    schema_version: Literal[1] = 1
    task_id: Identifier
    taskset: str | None = None
    version: str | None = None
    prompt: str = ""
    workspace: Files = Field(default_factory=dict)
    hidden_tests: Files = Field(min_length=1)
    grading: GradingSpec
    limits: Limits = Field(default_factory=Limits)
    reference: Files | None = None
    metadata: Metadata = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, raw: Any) -> Any:
        return refuse_unsupported(
            raw, {"image": "every task runs in the pool's sandbox image; remove the field"}
        )

    @model_validator(mode="before")
    @classmethod
    def _io_tests(cls, raw: Any) -> Any:
        """An io_match task's one hidden test file is the generated module."""
        grading = raw.get("grading") if isinstance(raw, dict) else None
        if isinstance(grading, dict) and grading.get("scorer") == Scorer.IO_MATCH:
            generated = {iomatch.TEST_FILE: TEST_MODULE}
            if raw.get("hidden_tests", generated) != generated:
                raise ValueError(
                    "an io_match task's hidden tests are its grading.io cases: remove hidden_tests"
                )
            return raw | {"hidden_tests": generated}
        return raw

    @model_validator(mode="after")
    def _expected_tests_are_hidden(self) -> Task:
        # An expected id in a file the agent can write would let the agent grade itself.
        for test_id in self.grading.expected_tests or []:
            path = test_id.split("::", 1)[0]
            if path not in self.hidden_tests:
                raise ValueError(
                    f"expected test {test_id!r} is not in a hidden_tests file "
                    f"({', '.join(sorted(self.hidden_tests))})"
                )
        if self.grading.scorer == Scorer.PERFORMANCE and self.reference is None:
            raise ValueError('scorer "performance" times the task\'s reference: set reference')
        return self

    @property
    def grading_timeout_s(self) -> float:
        return self.grading.timeout_for(self.limits.timeout_s)
