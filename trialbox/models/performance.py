"""The `performance` scorer's task fields and measurements (docs/sandbox.md, "Scorers")."""

from __future__ import annotations

from pydantic import Field

from trialbox.models.common import StrictModel

# What preparing one timed run may take: the slot swept and the side's files written.
TIMED_RUN_SETUP_S = 1.0


class PerformanceSpec(StrictModel):
    workload: str = Field(
        min_length=1,
        description="Python source run as `python -c` beside the solution's files (so "
        "`from solution import f` works); it should print what it computes (a solution's run "
        "must print what the reference's did, or its speed factor is 0), take well over the "
        "interpreter's start (100 ms of CPU or more) and exit 0",
    )
    repeats: int = Field(default=5, ge=3, le=21, description="interleaved runs of each side")
    tolerance: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="a median within (1 + tolerance) x the reference's scores a full factor",
    )
    memory: bool = Field(default=False, description="also a factor for peak memory")
    floor: float = Field(default=0.0, ge=0, le=1, description="the least factor")

    def runs_s(self, timeout_s: float) -> float:
        """The most wall time the timed runs can take under a command deadline of
        `timeout_s`: every run of both sides at its deadline (a solution that sleeps costs no
        CPU, but its runs still take their time), plus each run's fresh workspace."""
        return 2 * self.repeats * (timeout_s + TIMED_RUN_SETUP_S)


class PerformanceReport(StrictModel):
    """CPU seconds and peak MiB of each run, as the backend measured them from outside."""

    reference_cpu_s: list[float] = Field(default_factory=list)
    policy_cpu_s: list[float] = Field(default_factory=list)
    reference_peak_mb: list[float] = Field(default_factory=list)
    policy_peak_mb: list[float] = Field(default_factory=list)
    policy_failed: str | None = Field(default=None, description="the solution's workload failed")
    reference_failed: str | None = Field(
        default=None, description="the reference's workload failed: the scorer's failure"
    )
