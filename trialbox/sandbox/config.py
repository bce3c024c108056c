"""Where the sandbox runtime and slot state live, read once from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from trialbox.settings import EnvSettings

ENV_PREFIX = "TRIALBOX_SANDBOX_"


class SandboxConfig(EnvSettings):
    """The sandbox's settings: each field is read from TRIALBOX_SANDBOX_<NAME>. Both paths sit
    outside any checkout: the slot uids must be able to traverse them."""

    model_config = ConfigDict(alias_generator=lambda name: f"{ENV_PREFIX}{name.upper()}")

    runtime_dir: Path = Field(default=Path("/opt/trialbox/runtime"))
    state_dir: Path = Field(default=Path("/var/lib/trialbox"))
    cgroup_root: Path = Field(default=Path("/sys/fs/cgroup"))
    cgroup_parent: str = "trialbox"
    backend: Literal["bwrap", "rlimit"] = "bwrap"
    slots: int = Field(default=16, ge=1, le=1024)
    # Slot i runs the agent as uid_base + 2i and the grader as uid_base + 2i + 1.
    uid_base: int = Field(default=200_000, ge=1000)
    slot_wait_s: float = Field(default=120.0, gt=0)
    # rlimit: grading commands fork from a warm process per slot (trialbox/sandbox/warm.py).
    warm: bool = True
