"""The `performance` scorer's task fields and measurements (docs/sandbox.md, "Scorers")."""

from __future__ import annotations

from pydantic import Field

from trialbox.models.common import StrictModel

# What preparing one timed run may take beside a copy: the slot swept and the reference's
# files written.
TIMED_RUN_SETUP_S = 1.0
# The most one copy of a workspace may take: fs.copy_tree's deadline (`max_s`), past which
# the copy is refused, as a tree past a workspace's bounds is (the policy's ungradable
# workspace, never masked). A full workspace, fs.WORKSPACE_INODES names at the deepest level,
# copies in 1.4 s on an idle core of this machine (3.4 s as hard links), and in 10 s (18 s)
# with five processes to a core; data at 160 MiB/s or more (benchmarks/copy_bound.py). The
# deadline is there for a machine slower still: no workspace within bounds should meet it.
COPY_NAMES_S = 60.0
COPY_MIB_PER_S = 50.0


def copy_s(disk_mb: int) -> float:
    """The deadline of one copy of a workspace of `disk_mb`, and what a budget counts for it."""
    return COPY_NAMES_S + disk_mb / COPY_MIB_PER_S


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

    def runs_s(self, timeout_s: float, disk_mb: int) -> float:
        """The most wall time the timed runs can take under a command deadline of
        `timeout_s`: every run of both sides at its deadline (a solution that sleeps costs no
        CPU, but its runs still take their time), plus each run's fresh workspace, and every
        copy of the solution's files at its deadline: the one set aside before grading, and
        one per timed run of the solution."""
        copies = (self.repeats + 1) * copy_s(disk_mb)
        return 2 * self.repeats * (timeout_s + TIMED_RUN_SETUP_S) + copies


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
