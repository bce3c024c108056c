"""Every rlimit hostile case, as real jobs through the real worker loop, under the task
definition's constraints (tests/sandbox/test_rlimit.py runs the same programs on the host)."""

from __future__ import annotations

import pytest

from tests.fargate.harness import Harness, Service
from tests.fargate.programs import IDENTITY
from tests.fargate.submit import assert_not_sandbox_error, describe, python, request, run_jobs
from tests.support.programs import FORK_BOMB, SETSID_DAEMON
from tests.support.tasks import CORRECT
from trialbox.models import ExecutionResult, Status
from trialbox.sandbox.processes import processes_of
from trialbox.sdk import Client

FSIZE = (
    "try:\n"
    "    open('big', 'wb').write(b'x' * (20 * 1024 * 1024))\n"
    "except OSError as e:\n"
    "    print(e.errno)\n"
)
CASES = {
    "timeout": request(commands=[python("while True: pass")], timeout_s=1),
    "daemon": request(commands=[python(SETSID_DAEMON)]),
    "fork_bomb": request(commands=[python(FORK_BOMB)], pids=32),
    "memory": request(commands=[python("x = bytearray(600 * 1024 * 1024)")], memory_mb=256),
    "fsize": request(commands=[python(FSIZE)], disk_mb=8, memory_mb=256),
    "identity": request(commands=[python(IDENTITY)]),
    "grading": request(
        files={"solution.py": CORRECT, "conftest.py": "import os\nos._exit(0)\n"}, grade=True
    ),
}


@pytest.fixture(scope="module")
def results(client: Client, service: Service, harness: Harness) -> dict[str, ExecutionResult]:
    with harness.sampling() as sampled:
        done = run_jobs(client, service, list(CASES.values()))
    assert sampled["found"] == {}, sampled
    return dict(zip(CASES, done, strict=True))


def test_every_job_is_terminal_and_never_a_sandbox_error(
    results: dict[str, ExecutionResult], harness: Harness, service: Service
) -> None:
    for result in results.values():
        assert_not_sandbox_error(result)
    assert processes_of(tuple(harness.slot_uids())) == []  # nothing outlived its job
    assert service.failures() == []


def test_timeout_kills_the_whole_session(results: dict[str, ExecutionResult]) -> None:
    (command,) = results["timeout"].commands
    assert (results["timeout"].status, command.timed_out, command.signal) == (
        Status.TIMEOUT, True, "SIGKILL",
    )  # fmt: skip
    assert command.wall_s < 3


def test_setsid_daemon_is_killed(results: dict[str, ExecutionResult]) -> None:
    assert results["daemon"].status == Status.SUCCEEDED, describe(results["daemon"])
    assert results["daemon"].commands[0].stdout == "parent done\n"


def test_fork_bomb_hits_nproc(results: dict[str, ExecutionResult]) -> None:
    stdout = results["fork_bomb"].commands[0].stdout
    forked, errno = map(int, stdout.split())
    assert errno == 11 and forked < 32


def test_memory_limit_makes_allocation_fail(results: dict[str, ExecutionResult]) -> None:
    (command,) = results["memory"].commands
    assert command.exit_code == 1 and "MemoryError" in command.stderr
    assert command.oom_killed is False


def test_file_size_limit_gives_efbig(results: dict[str, ExecutionResult]) -> None:
    assert results["fsize"].commands[0].stdout == "27\n"


def test_environment_is_explicit_and_uid_unprivileged(
    results: dict[str, ExecutionResult], harness: Harness
) -> None:
    first, caps = results["identity"].commands[0].stdout.splitlines()
    uid, aws = first.split(" ", 1)
    assert int(uid) in harness.slot_uids() and aws == "[]"
    assert caps.split() == ["0000000000000000", "0000000000000000", "1"]


def test_grading_works(results: dict[str, ExecutionResult]) -> None:
    result = results["grading"]
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), describe(result)
    assert result.provenance is not None and result.provenance.backend == "rlimit"
