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
from trialbox.qc import STRENGTH_THRESHOLD, Check, TaskQC, validate

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
    """Run each task's reference and starter in the sandbox; exit 1 if any task fails a check,
    3 if the sandbox failed a run (nothing is concluded about that task)."""
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
    pool = ThreadPoolExecutor(jobs)
    try:
        with Progress(console=err, transient=True) as progress:
            bar = progress.add_task("validating tasks", total=len(task_list))
            futures = {pool.submit(validate, runner, t, repeats, mutants): t for t in task_list}
            for future in as_completed(futures):
                task = futures[future]
                try:
                    reports[task.task_id] = future.result()
                except Exception as exc:  # one task's crash is that task's problem
                    crashed = TaskQC(task.task_id)
                    crashed.checks.append(Check("crash", False, f"{type(exc).__name__}: {exc}"))
                    reports[task.task_id] = crashed
                progress.advance(bar)
    finally:  # Ctrl-C: no more sandboxes for the tasks not started
        pool.shutdown(wait=True, cancel_futures=True)
    ordered = [reports[t.task_id] for t in task_list]
    _print(ordered)
    if json_out is not None:
        json_out.write_text("".join(json.dumps(_as_json(qc)) + "\n" for qc in ordered))
    if write:
        unset = {t.task_id for t in task_list if t.grading.expected_tests is None}
        fill = {qc.task_id: qc.collected for qc in ordered if qc.task_id in unset}
        _write_expected(tasks, {k: v for k, v in fill.items() if v and _collected_ok(reports[k])})
    if any(qc.sandbox_errors for qc in ordered):
        raise typer.Exit(EXIT_SANDBOX)
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
        "survivors": qc.survivors,
        "sandbox_errors": qc.sandbox_errors,
    }


def _collected_ok(qc: TaskQC) -> bool:
    return all(c.ok for c in qc.checks if c.name in ("reference", "flaky"))


def _write_expected(path: Path, collected: dict[str, list[str]]) -> None:
    """Set `grading.expected_tests` where it is unset, line by line: every other line stays
    byte for byte, each line keeps its ending, and the file its BOM and mode."""
    data = path.read_bytes()
    bom = data.startswith(b"\xef\xbb\xbf")
    lines = data.decode("utf-8-sig").splitlines(keepends=True)
    filled = 0
    for number, line in enumerate(lines):
        body = line.rstrip("\r\n")
        try:
            raw = json.loads(body)
        except ValueError:
            continue
        ids = collected.get(str(raw.get("task_id"))) if isinstance(raw, dict) else None
        grading = raw.get("grading") if ids else None
        if isinstance(grading, dict) and grading.get("expected_tests") is None:
            grading["expected_tests"] = ids
            lines[number] = json.dumps(raw) + line[len(body) :]
            filled += 1
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "".join(lines).encode())
    os.chmod(temporary, path.stat().st_mode & 0o7777)
    temporary.replace(path.resolve())
    err.print(f"{path}: expected_tests filled in for {filled} task(s)")
