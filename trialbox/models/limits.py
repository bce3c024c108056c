"""Resource limits of one sandboxed command. Memory and disk are in MiB."""

from __future__ import annotations

from pydantic import Field

from trialbox.models.common import StrictModel

MAX_TIMEOUT_S = 3600.0
MAX_MEMORY_MB = 65_536
MAX_OUTPUT_BYTES = 16 * 1024 * 1024


class Limits(StrictModel):
    """The defaults are what a task gets when it names no limit.

    The disk is a tmpfs whose pages count against the memory cgroup, so `disk_mb` is clamped to
    `memory_mb / 2` (see `effective`), with a note in the run report.
    """

    timeout_s: float = Field(default=10.0, gt=0, le=MAX_TIMEOUT_S, description="wall seconds")
    memory_mb: int = Field(default=512, ge=32, le=MAX_MEMORY_MB, description="MiB")
    disk_mb: int = Field(default=64, ge=1, le=MAX_MEMORY_MB // 2, description="MiB")
    pids: int = Field(default=128, ge=8, le=16_384)
    cpus: float = Field(default=1.0, ge=0.1, le=64, description="CPU quota in cores")
    output_bytes: int = Field(
        default=65_536, ge=1024, le=MAX_OUTPUT_BYTES, description="kept per stream"
    )

    def effective(self) -> tuple[Limits, list[str]]:
        """The limits the sandbox enforces, with a note for every value it had to adjust."""
        cap = self.memory_mb // 2
        if self.disk_mb <= cap:
            return self, []
        note = (
            f"disk_mb {self.disk_mb} clamped to {cap} (half of memory_mb {self.memory_mb}): "
            "the workspace is a tmpfs charged to the memory limit"
        )
        return self.model_copy(update={"disk_mb": cap}), [note]


class LimitOverrides(StrictModel):
    """Limits a request asks for. They may only tighten the task's limits, never widen them."""

    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    memory_mb: int | None = Field(default=None, ge=32, le=MAX_MEMORY_MB)
    disk_mb: int | None = Field(default=None, ge=1, le=MAX_MEMORY_MB // 2)
    pids: int | None = Field(default=None, ge=8, le=16_384)
    cpus: float | None = Field(default=None, ge=0.1, le=64)
    output_bytes: int | None = Field(default=None, ge=1024, le=MAX_OUTPUT_BYTES)

    def tighten(self, base: Limits) -> Limits:
        """Each requested value applies only where it is lower than the task's."""
        requested = self.model_dump(exclude_none=True)
        current = base.model_dump()
        return Limits(
            **{key: min(value, current[key]) for key, value in requested.items()}
            | {key: value for key, value in current.items() if key not in requested}
        )
