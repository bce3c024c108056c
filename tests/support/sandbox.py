"""Shapes of the sandbox fixtures (tests/sandbox/conftest.py) and a sandbox in another slot."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from trialbox.models import Limits
from trialbox.models.report import CommandResult, RunReport
from trialbox.models.result import ExecutionResult
from trialbox.sandbox.runner import Runner

Exec = Callable[..., CommandResult]
Grade = Callable[..., tuple[RunReport, ExecutionResult]]


@contextlib.contextmanager
def secret_in_another_slot(runner: Runner) -> Iterator[Path]:
    """A sandbox in another slot holds a secret file; yields its host path while it runs. The
    file's name is this call's own: another runner's sandboxes never match it."""
    secret = f"secret-{uuid.uuid4()}"
    name = f"mine-{uuid.uuid4().hex}"
    other = threading.Thread(
        target=runner.exec, args=(["sh", "-c", f"echo {secret} > {name}; sleep 3"], Limits())
    )
    other.start()
    try:
        deadline = time.monotonic() + 5
        found: list[Path] = []
        while not found and time.monotonic() < deadline:
            found = list(runner.slots.slots_dir.glob(f"*/work/{name}"))
            time.sleep(0.05)
        assert found, "the other sandbox never wrote its secret"
        yield found[0]
    finally:
        other.join()
