"""`trialbox run` and `trialbox demo`: the front end of the run job (`trialbox.runs`)."""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trialbox.runs import DEFAULT_TIMEOUT_S, RunJob, summary
from trialbox.sdk.resources import UNKNOWN_CAPACITY_CONCURRENCY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasksets"
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)
CONCURRENCY_HELP = (
    "samples in flight at once [default: 4 x the pool's workers (the twin's, or the stack's "
    f"pool.max_workers), or {UNKNOWN_CAPACITY_CONCURRENCY} when unknown]"
)
GRACE_S = 5  # how long Ctrl-C waits for the samples in flight
PER_SAMPLE_ROWS = 40  # runs up to this size also get a row per sample
FEEDBACK_MIN = 24


@contextmanager
def _stop_on_signals(job: RunJob) -> Iterator[None]:
    """The first SIGINT/SIGTERM stops sending and waits GRACE_S for what is in flight; a
    second one, or the grace's end, quits (the run job keeps what finished)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False
    # The grace's end is a second SIGINT to the main thread from a timer, not SIGALRM: the
    # process's one alarm may be its host's (pytest-timeout's, in a test calling run_job).
    main = threading.main_thread().ident
    assert main is not None
    grace = threading.Timer(GRACE_S, signal.pthread_kill, (main, signal.SIGINT))
    grace.daemon = True

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            raise KeyboardInterrupt
        stopping = True
        in_flight = job.interrupt()
        err.print(
            f"stopping: no more submissions; waiting up to {GRACE_S} s for {in_flight} "
            "sample(s) in flight (Ctrl-C again to quit now)"
        )
        grace.start()

    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, stop) for sig in sigs}
    try:
        yield
    finally:
        grace.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_job(job: RunJob) -> int:
    """Run the job, drawing progress and the summary; the exit code (2: bad input)."""
    job.warn = lambda message: err.print(f"warning: {message}")
    problems = job.prepare()
    if problems:
        err.print("\n".join(f"error: {p}" for p in problems))
        return 2
    if job.resumed:
        err.print(
            f"resuming run {job.run_id}: {job.resumed} of {len(job.requests)} sample(s) "
            f"already have results in {job.out}; "
            + (f"running the other {len(job.todo)}" if job.todo else "nothing left to run")
        )
    with Progress(console=err, transient=True) as progress:
        bar = progress.add_task("samples", total=len(job.requests), completed=job.resumed)

        def starting() -> None:
            err.print("starting the local twin (moto + bwrap sandboxes)...")

        with _stop_on_signals(job):
            job.execute(lambda row: progress.advance(bar), starting)
    _print_summary(job)
    if job.failure:
        err.print(f"error: {job.failure}")
    elif job.missing:  # the run's timeout passed
        err.print(
            f"error: {job.missing} sample(s) had no terminal result within --timeout "
            f"{job.timeout_s:g} s (slow samples, or a stalled pipeline: a deployment's DLQs "
            "say which)"
            + (
                "; the local twin stopped with the run and dropped the samples in flight, so "
                "the resume runs with the default --timeout"
                if job.twin_started
                else ""
            )
        )
    if job.missing:
        err.print(
            f"{job.missing} sample(s) have no result yet. Resume with:\n  {job.resume_command()}"
        )
    return 1 if (job.failure or job.missing) else 0


def _sample_table(rows: list[dict[str, Any]], width: int) -> Table:
    """A row per sample; status and reward are never cut, the ids give way before feedback's
    minimum, and feedback takes the rest."""
    each = Table(title="samples")
    status_w = max(6, *(len(r["status"]) for r in rows))
    room = width - 16 - status_w - 6  # borders, status and reward, never cut
    task_w = min(24, max(4, *(len(str(r["task_id"])) for r in rows)))
    sample_w = min(24, max(6, *(len(str(r["sample_id"])) for r in rows)))
    while task_w + sample_w + FEEDBACK_MIN > room and max(task_w, sample_w) > 6:
        if task_w >= sample_w:  # ids give way before feedback's minimum
            task_w -= 1
        else:
            sample_w -= 1
    each.add_column("task", no_wrap=True, overflow="ellipsis", width=task_w)
    each.add_column("sample", no_wrap=True, overflow="ellipsis", width=sample_w)
    each.add_column("status", no_wrap=True, width=status_w)
    each.add_column("reward", no_wrap=True, width=6)
    feedback_w = max(FEEDBACK_MIN, room - task_w - sample_w)
    each.add_column("feedback", no_wrap=True, overflow="ellipsis", width=feedback_w)
    for row in rows:
        reward = "-" if row["reward"] is None else f"{row['reward']:.2f}"
        feedback = " ".join((row["feedback"] or "").split())  # one line, cut to fit
        each.add_row(row["task_id"], row["sample_id"], row["status"], reward, feedback)
    return each


def _print_summary(job: RunJob) -> None:
    rows = job.ordered
    console = Console(soft_wrap=True, markup=False, highlight=False)
    if rows and len(rows) <= PER_SAMPLE_ROWS:  # a small run: each sample's outcome at a glance
        console.print(_sample_table(rows, console.width))
    stats = summary(rows)
    table = Table(title=f"{len(rows)}/{len(job.requests)} samples")
    table.add_column("status")
    table.add_column("count", justify="right")
    for status, count in sorted(stats["counts"].items()):
        table.add_row(status, str(count))
    console.print(table)
    mean = stats["mean_reward"]
    console.print(
        f"mean reward {mean:.3f}" if mean is not None else "mean reward n/a",
        f"| latency p50 {stats['p50_s']} s, p95 {stats['p95_s']} s" if rows else "",
    )
    if job.traces_dir is not None:
        where = f"{job.traces_dir}/ (one <request_id>.json per sample)"
    else:
        where = ", ".join(sorted({r["trace_uri"].rsplit("/", 1)[0] + "/" for r in rows
                                  if r.get("trace_uri")})) or "none"  # fmt: skip
    console.print(f"results: {job.out}")
    console.print(f"traces:  {where}")


def run_command(
    tasks: Annotated[Path, typer.Option(help="tasks.jsonl")],
    samples: Annotated[Path, typer.Option(help="samples.jsonl")],
    out: Annotated[Path, typer.Option(help="results, one JSON line per sample")],
    local: Annotated[bool, typer.Option("--local", help="force the local twin")] = False,
    endpoint_url: Annotated[str | None, typer.Option(help="AWS or twin endpoint")] = None,
    stack: Annotated[str | None, typer.Option(help="a deployed stack's name")] = None,
    run_id: Annotated[str | None, typer.Option(help="reuse to resume a run")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help=CONCURRENCY_HELP),
    ] = None,
    traces_dir: Annotated[
        Path | None,
        typer.Option(help="download each trace here [default with the twin: OUT.traces/]"),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="seconds to wait for every result")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Run every sample through the pipeline; write one result per sample, in input order."""
    job = RunJob(tasks, samples, out, local=local, endpoint_url=endpoint_url, stack=stack,
                 run_id=run_id, concurrency=concurrency, traces_dir=traces_dir,
                 timeout_s=timeout)  # fmt: skip
    raise typer.Exit(run_job(job))


def demo_command(
    out: Annotated[Path, typer.Option(help="where the results go")] = Path("demo-results.jsonl"),
) -> None:
    """The bundled example task set on the local twin."""
    tasks, samples = EXAMPLES / "demo.jsonl", EXAMPLES / "demo-samples.jsonl"
    if not tasks.exists():
        typer.echo("the example task set ships with a checkout: examples/tasksets/", err=True)
        raise typer.Exit(2)
    job = RunJob(tasks, samples, out, local=True, run_id=f"demo-{uuid.uuid4().hex[:8]}")
    code = run_job(job)
    sys.stdout.flush()
    raise typer.Exit(code)
