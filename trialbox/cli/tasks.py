"""`trialbox tasks validate`: task QC in the sandbox, without AWS (trialbox.qc)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trialbox.errors import InputError, SandboxError
from trialbox.models.jsonl import load_tasks
from trialbox.qc import STRENGTH_THRESHOLD, TaskQC, validate

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SANDBOX = 3

tasks_app = typer.Typer(no_args_is_help=True, help="Check task sets before training on them.")
out = Console(soft_wrap=True, markup=False, highlight=False)
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


@tasks_app.command("validate")
def validate_command(
    tasks: Annotated[Path, typer.Argument(help="tasks.jsonl")],
    repeats: Annotated[int, typer.Option(min=1, help="reference runs (flakiness)")] = 3,
    mutants: Annotated[int, typer.Option(min=0, help="mutants per task (0: no strength)")] = 20,
    jobs: Annotated[int, typer.Option(min=1, help="tasks checked at once")] = 2,
    write: Annotated[
        bool,
        typer.Option("--write", help="fill unset expected_tests in TASKS with the collected ids"),
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="every check, as JSON")] = None,
) -> None:
    """Run each task's reference and starter in the sandbox; exit 1 if any task fails a check."""
    try:
        task_list = load_tasks(tasks)
    except InputError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    from trialbox.sandbox.runner import Runner  # late: the SDK-only commands never need it

    try:
        runner = Runner()
    except SandboxError as exc:
        err.print(f"error: the sandbox failed: {exc}")
        raise typer.Exit(EXIT_SANDBOX) from None
    reports: dict[str, TaskQC] = {}
    with Progress(console=err, transient=True) as progress, ThreadPoolExecutor(jobs) as pool:
        bar = progress.add_task("validating tasks", total=len(task_list))
        futures = {pool.submit(validate, runner, t, repeats, mutants): t for t in task_list}
        for future in as_completed(futures):
            qc = future.result()
            reports[qc.task_id] = qc
            progress.advance(bar)
    ordered = [reports[t.task_id] for t in task_list]
    _print(ordered)
    if json_out is not None:
        json_out.write_text("".join(json.dumps(_as_json(qc)) + "\n" for qc in ordered))
    if write:
        _write_expected(tasks, {qc.task_id: qc.collected for qc in ordered if _collected_ok(qc)})
    if any(qc.failed for qc in ordered):
        raise typer.Exit(EXIT_FAILED)


def _print(reports: list[TaskQC]) -> None:
    summary = Table(title="tasks")
    for column in ("task", "result", "ref grading s", "ref peak MiB", "mutation score", "leaks"):
        summary.add_column(column)
    for qc in reports:
        score = "-" if qc.mutation_score is None else f"{qc.mutation_score:.2f} of {qc.mutants}"
        if qc.mutation_score is not None and qc.mutation_score < STRENGTH_THRESHOLD:
            score += " (weak)"
        summary.add_row(
            qc.task_id,
            "FAIL" if qc.failed else "ok",
            "-" if qc.reference_wall_s is None else f"{qc.reference_wall_s:.2f}",
            "-" if qc.reference_peak_mb is None else f"{qc.reference_peak_mb:.0f}",
            score,
            str(len(qc.leaks)),
        )
    out.print(summary)
    problems = Table(title="problems")
    for column in ("task", "check", "kind", "detail"):
        problems.add_column(column)
    for qc in reports:
        for check in qc.problems():
            kind = "failure" if check.failing else "report"
            problems.add_row(qc.task_id, check.name, kind, check.detail)
    if problems.row_count:
        out.print(problems)
    failed = sum(qc.failed for qc in reports)
    out.print(f"{len(reports) - failed} of {len(reports)} task(s) pass")


def _as_json(qc: TaskQC) -> dict[str, object]:
    return {
        "task_id": qc.task_id,
        "failed": qc.failed,
        "checks": [vars(c) for c in qc.checks],
        "collected": qc.collected,
        "mutation_score": qc.mutation_score,
        "mutants": qc.mutants,
        "leaks": qc.leaks,
        "reference_wall_s": qc.reference_wall_s,
        "reference_peak_mb": qc.reference_peak_mb,
    }


def _collected_ok(qc: TaskQC) -> bool:
    return bool(qc.collected) and all(c.ok for c in qc.checks if c.name in ("reference", "flaky"))


def _write_expected(path: Path, collected: dict[str, list[str]]) -> None:
    """Set `grading.expected_tests` where it is unset, line by line; nothing else changes."""
    lines = path.read_text().split("\n")
    filled = 0
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        raw = json.loads(line)
        ids = collected.get(raw.get("task_id"))
        if ids and raw.get("grading", {}).get("expected_tests") is None:
            raw["grading"]["expected_tests"] = ids
            lines[number] = json.dumps(raw, ensure_ascii=False)
            filled += 1
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text("\n".join(lines))
    temporary.replace(path)
    err.print(f"{path}: expected_tests filled in for {filled} task(s)")
