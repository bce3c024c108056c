"""The typed result a trainer receives, and the reward and loss-mask rules (docs/sandbox.md,
"Statuses, rewards, loss masks")."""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import ConfigDict, Field

from trialbox.models.common import StrictModel
from trialbox.models.report import CommandResult, Provenance, Status, TestRecord


class RewardRule(NamedTuple):
    scored: bool  # True: the scorer's number; False: `fixed`
    fixed: float | None
    loss_mask: bool


# The policy's failures get a number. The platform's failures never do.
REWARD_RULES: dict[Status, RewardRule] = {
    Status.SUCCEEDED: RewardRule(scored=True, fixed=None, loss_mask=False),
    Status.TIMEOUT: RewardRule(scored=False, fixed=0.0, loss_mask=False),
    Status.OOM: RewardRule(scored=False, fixed=0.0, loss_mask=False),
    Status.INTEGRITY_VIOLATION: RewardRule(scored=False, fixed=0.0, loss_mask=False),
    Status.REJECTED: RewardRule(scored=False, fixed=None, loss_mask=True),
    Status.SANDBOX_ERROR: RewardRule(scored=False, fixed=None, loss_mask=True),
    Status.CANCELLED: RewardRule(scored=False, fixed=None, loss_mask=True),
}


def reward_for(status: Status, scored_reward: float | None) -> tuple[float | None, bool]:
    """(reward, loss_mask) for a status; `scored_reward` is used only where the rule says so."""
    rule = REWARD_RULES[status]
    return (scored_reward if rule.scored else rule.fixed), rule.loss_mask


class Timings(StrictModel):
    """Epoch seconds: Prepare queued the job, a worker took it, its run ended. The last pair
    is the sandbox time; the first gap is the wait for a free worker."""

    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None


class ExecutionResult(StrictModel):
    # Written by the pipeline, read by SDKs of any version within the stack's major.minor: a
    # field one side does not know is ignored, never an error.
    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = 1
    request_id: str | None = None
    task_id: str | None = None
    sample_id: str | None = None
    status: Status
    reward: float | None = Field(default=None, description="None unless graded and valid")
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    loss_mask: bool = Field(description="True: the trainer must not learn from this sample")
    tests_passed: int = 0
    tests_expected: int = 0
    feedback: str = ""
    flags: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="adjustments, e.g. clamped limits")
    error: str | None = None
    commands: list[CommandResult] = Field(default_factory=list)
    tests: list[TestRecord] = Field(default_factory=list)
    checkpoint: str | None = Field(
        default=None, description="the workspace after the commands, if the request asked"
    )
    attempts: int = Field(default=1, description="Execute attempts: 1 + lost-sandbox retries")
    timings: Timings = Field(default_factory=Timings)
    provenance: Provenance | None = None
    trace_uri: str | None = None

    @property
    def reward_or_none(self) -> float | None:
        """The reward a trainer may learn from: None whenever `loss_mask` is true (leave the
        sample out of its group)."""
        return None if self.loss_mask else self.reward


def result_for(
    request_id: str | None,
    status: Status,
    *,
    error: str | None = None,
    feedback: str | None = None,
    scored_reward: float | None = None,
    flags: list[str] | None = None,
    task_id: str | None = None,
    sample_id: str | None = None,
) -> ExecutionResult:
    """A result that no run report scored (rejected, sandbox_error, cancelled, no code): its
    reward and loss mask come from REWARD_RULES, like every other result's."""
    reward, loss_mask = reward_for(status, scored_reward)
    return ExecutionResult(
        request_id=request_id,
        task_id=task_id,
        sample_id=sample_id,
        status=status,
        reward=reward,
        loss_mask=loss_mask,
        error=error,
        feedback=feedback if feedback is not None else (error or ""),
        flags=flags or [],
    )


INVALID_FILES_FLAG = "invalid_files"


def ungradable(
    request_id: str | None, task_id: str, sample_id: str, reason: str
) -> ExecutionResult:
    """The result of a sample whose files or commands cannot be run (text that is not valid
    Unicode, a path out of the workspace): the policy wrote them, so it is the policy's 0,
    `loss_mask` false, never a rejection of the batch it came in."""
    return result_for(
        request_id,
        Status.SUCCEEDED,
        scored_reward=0.0,
        feedback=f"the files or commands this sample wrote cannot be graded: {reason}",
        flags=[INVALID_FILES_FLAG],
        task_id=task_id,
        sample_id=sample_id,
    )
