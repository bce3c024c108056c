"""A command's wall deadline holds whatever the command does with its output: one that closes
its stdout and stderr (every pipe the runner reads) and then runs on is still killed at its
deadline, on both backends. Was a break: the runner stopped watching the deadline once the pipes
closed and waited for the process with none (8.1 s for a 2 s limit, `succeeded`)."""

from __future__ import annotations

import pytest

from trialbox.models import Limits
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner

CLOSE_PIPES = "import os, time\nos.close(1)\nos.close(2)\n"


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def runner(request: pytest.FixtureRequest) -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": request.param}))


@pytest.mark.parametrize("then", ["time.sleep(30)", "while True: pass"])
def test_closing_every_pipe_does_not_escape_the_deadline(runner: Runner, then: str) -> None:
    result = runner.exec(["python", "-c", CLOSE_PIPES + then], Limits(timeout_s=2))
    assert (result.timed_out, result.exit_code, result.signal) == (True, None, "SIGKILL")
    assert result.wall_s < 6, result.wall_s
