"""`trialbox sandbox exec` and `trialbox sandbox grade`: the sandbox without AWS."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from trialbox.errors import InputError, SandboxError
from trialbox.models.jsonl import load_tasks_and_samples
from trialbox.models.limits import Limits
from trialbox.models.report import Status
from trialbox.models.result import ungradable as ungradable_result
from trialbox.scoring import score

if TYPE_CHECKING:  # the runner is imported late: SDK-only commands never need it
    from trialbox.sandbox.runner import Runner

EXIT_USAGE = 2
EXIT_SANDBOX = 3

sandbox_app = typer.Typer(no_args_is_help=True, help="Run sandboxes directly, without AWS.")

GRADE_FIELDS = (
    "task_id",
    "sample_id",
    "status",
    "reward",
    "loss_mask",
    "tests_passed",
    "tests_expected",
    "feedback",
    "flags",
    "notes",
    "error",
    "tests",
    "commands",
    "provenance",
)


def _runner() -> Runner:
    from trialbox.sandbox.runner import Runner

    return Runner()


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@sandbox_app.command("exec")
def exec_command(
    cmd: Annotated[list[str], typer.Argument(help="the command, after --")],
    memory_mb: Annotated[int, typer.Option(help="memory limit, MiB")] = 512,
    timeout_s: Annotated[float, typer.Option(help="wall-clock limit, seconds")] = 10.0,
    pids: Annotated[int, typer.Option(help="process limit")] = 128,
    cpus: Annotated[float, typer.Option(help="CPU quota, cores")] = 1.0,
    disk_mb: Annotated[int, typer.Option(help="workspace size, MiB")] = 64,
    files: Annotated[
        Path | None,
        typer.Option(exists=True, file_okay=False, help="copy this directory into the workspace"),
    ] = None,
) -> None:
    """Run one command in a fresh sandbox and print what happened as one JSON object."""
    try:
        limits = Limits(
            memory_mb=memory_mb, timeout_s=timeout_s, pids=pids, cpus=cpus, disk_mb=disk_mb
        )
    except ValidationError as exc:
        details = "; ".join(
            f"--{'-'.join(str(e['loc'][0]).split('_'))}: {e['msg']}" for e in exc.errors()
        )
        _fail(details, EXIT_USAGE)
    try:
        result = _runner().exec(list(cmd), limits, files)
    except SandboxError as exc:
        _fail(f"the sandbox failed: {exc}", EXIT_SANDBOX)
    typer.echo(result.model_dump_json())


@sandbox_app.command("grade")
def grade_command(
    tasks: Annotated[Path, typer.Option(help="tasks.jsonl")],
    samples: Annotated[Path, typer.Option(help="samples.jsonl")],
) -> None:
    """Agent phase, grading and scoring for every sample; one JSON result per line."""
    try:
        task_list, sample_list, ungradable = load_tasks_and_samples(tasks, samples)
    except InputError as exc:
        _fail(str(exc), EXIT_USAGE)
    by_id = {task.task_id: task for task in task_list}
    try:
        runner = _runner()
    except SandboxError as exc:
        _fail(f"the sandbox failed: {exc}", EXIT_SANDBOX)
    failed = False
    for sample in sample_list:
        task = by_id[sample.task_id]
        reason = ungradable.get((sample.task_id, sample.sample_id))
        if reason is not None:  # what this sample wrote cannot run: its 0, not the batch's
            result = ungradable_result(None, sample.task_id, sample.sample_id, reason)
        else:
            result = score(task.grading, runner.run(task, sample))
        failed |= result.status == Status.SANDBOX_ERROR
        sys.stdout.write(result.model_dump_json(include=set(GRADE_FIELDS)) + "\n")
        sys.stdout.flush()
    if failed:
        raise typer.Exit(EXIT_SANDBOX)
