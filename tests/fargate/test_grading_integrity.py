"""The grading boundary on both backends: the red-team corpus (tests/redteam/hacks.py) and the
hostile corpus (tests/redteam/corpus.py) on bwrap, as tests/redteam runs them, and as real jobs
through the worker as the task definition runs it (rlimit backend, the task's capabilities)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest

from tests.fargate.harness import Harness, Service
from tests.fargate.submit import graded_job, run_in_window
from tests.redteam.corpus import HOSTILE, Hostile, result_summary
from tests.redteam.hacks import HACKS, Hack
from trialbox.models import ExecutionResult, Sample
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score
from trialbox.sdk import Client

ROWS: list[Hack | Hostile] = [*HACKS, *HOSTILE]
# Jobs in flight at once. The worker runs one job at a time: one more queued keeps it busy,
# and waits only for the job ahead of it (under ROOM_S plus its commands), far inside the
# heartbeat (the twin's: 60 s) a queued job must start within, as on AWS.
IN_FLIGHT = 2


class DeclaredOutcomes(UserWarning):
    """Carries the table to the log: under xdist a passing test's output is not shown, its
    warnings are (the warnings summary)."""


def _on_bwrap(rows: list[Hack | Hostile]) -> list[ExecutionResult]:
    runner = Runner(SandboxConfig.from_env().model_copy(update={"backend": "bwrap"}))

    def grade(row: Hack | Hostile) -> ExecutionResult:
        sample = Sample(
            task_id=row.task.task_id, sample_id=row.name, files=row.files, commands=row.commands
        )
        return score(row.task.grading, runner.run(row.task, sample))

    # One at a time, as the worker runs its jobs: the worker's side is the longer anyway, and
    # a row's wall limits are its margin (tests/redteam/corpus.py: OVERRUN_S, ROOM_S).
    return [grade(row) for row in rows]


def phases(result: ExecutionResult) -> str:
    """Each command's phase, status and wall seconds: which one ended the run, and how far
    inside its limit."""
    return " ".join(f"{c.phase}:{c.status.value}:{c.wall_s:.1f}s" for c in result.commands)


def table(
    rows: list[Hack | Hostile], bwrap: list[ExecutionResult], rlimit: list[ExecutionResult]
) -> str:
    """A cell is the result, the grading's wall seconds (against the row's margin:
    tests/redteam/corpus.py), and `!` where it is not the declared value."""
    lines = [f"{'row':<38} {'declared':<34} {'bwrap':<36} rlimit"]
    for row, on_bwrap, on_rlimit in zip(rows, bwrap, rlimit, strict=True):
        cells = [str(row.expect)]
        for result in (on_bwrap, on_rlimit):
            graded = [c.wall_s for c in result.commands if c.phase == "grading"]
            took = f" ({graded[-1]:.1f} s)" if graded else ""
            mark = "" if row.expect.matches(result) else " !"
            cells.append(result_summary(result) + took + mark)
        lines.append(f"{row.name:<38} {cells[0]:<34} {cells[1]:<36} {cells[2]}")
    return "\n".join(lines)


@pytest.fixture
def fresh_worker(harness: Harness) -> Iterator[Service]:
    """A worker of its own: a row that wedges or dirties one harms no later test."""
    running = harness.service()
    try:
        yield running
    finally:
        with contextlib.suppress(AssertionError):  # a wedged worker is killed, then this
            running.stop()


def test_both_corpora_get_their_declared_outcome_on_both_backends(
    client: Client, fresh_worker: Service
) -> None:
    jobs = [graded_job(row.task, row.files, row.commands) for row in ROWS]
    # One backend after the other: the rlimit worker's memory bound counts the machine's
    # shared memory as a Fargate task has it, its own sandbox's alone, and the bwrap rows'
    # tmpfs ballast beside it was charged to a reference run (a masked sandbox_error).
    rlimit = run_in_window(client, fresh_worker, jobs, IN_FLIGHT, timeout=180)
    on_bwrap = _on_bwrap(ROWS)
    shown = table(ROWS, on_bwrap, rlimit)
    print(shown)
    warnings.warn(DeclaredOutcomes("\n" + shown), stacklevel=1)
    wrong = [
        (row.name, backend, phases(result), result.feedback[:300], result.error)
        for row, *pair in zip(ROWS, on_bwrap, rlimit, strict=True)
        for backend, result in zip(("bwrap", "rlimit"), pair, strict=True)
        if not row.expect.matches(result)
    ]
    assert wrong == [], shown + "\n\n" + "\n".join(map(str, wrong))
    assert fresh_worker.failures() == []  # no container ran out of memory or crashed
