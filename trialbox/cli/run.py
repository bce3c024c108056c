"""`trialbox run` and `trialbox demo`: every sample through the pipeline, one result each."""

from __future__ import annotations

import json
import os
import shlex
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

from trialbox.client import Client, MissingResources
from trialbox.driver import UNKNOWN_CAPACITY_CONCURRENCY, Driver, default_concurrency
from trialbox.errors import InputError, TrialboxError
from trialbox.models import ExecutionRequest, ExecutionResult, Sample
from trialbox.models.jsonl import load_tasks_and_samples
from trialbox.pipeline.prepare import taskset_key
from trialbox.runs import (
    ResultLog,
    finished_ids,
    is_result_file,
    result_line,
    summary,
    taskset_version,
    to_request,
    write_atomically,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasksets"
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


CONCURRENCY_HELP = (
    "samples in flight at once [default: 4 x the pool's workers (the twin's, or the stack's "
    f"pool.max_workers), or {UNKNOWN_CAPACITY_CONCURRENCY} when unknown]"
)
DEFAULT_TIMEOUT_S = 3600.0
GRACE_S = 5.0  # how long Ctrl-C waits for the samples in flight
PER_SAMPLE_ROWS = 40  # runs up to this size also get a row per sample
FEEDBACK_MIN = 24


def _remote_client(local: bool, endpoint_url: str | None, stack: str | None) -> Client | None:
    """The deployment named by the options or the environment; None means the local twin.
    A target that cannot be reached as given is the user's to fix: InputError."""
    endpoint = endpoint_url or os.environ.get("TRIALBOX_ENDPOINT_URL")
    try:
        if not local and endpoint:
            return Client(endpoint_url=endpoint)
        if not local and stack:
            return Client.from_stack(stack)
    except MissingResources as exc:
        raise InputError(
            f"--endpoint-url {endpoint} needs the stack's resource names: set "
            f"{', '.join(exc.missing)} (`trialbox local up` prints them), or use --stack NAME"
        ) from exc
    except TrialboxError as exc:
        hint = "" if endpoint else "\n  check the stack name, and AWS_REGION / AWS_PROFILE"
        raise InputError(f"{exc}{hint}") from exc
    return None


def _out_problem(tasks: Path, samples: Path, out: Path) -> str | None:
    """Why the results could not be written to `out`, or None."""
    for name, source in (("--tasks", tasks), ("--samples", samples)):
        if out.exists() and source.exists() and out.resolve() == source.resolve():
            return f"--out {out} is the {name} file: the results would overwrite it"
    if out.is_dir():
        return f"--out {out} is a directory: give a file path"
    if not out.parent.is_dir():
        return f"--out {out}: directory {out.parent} does not exist"
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        return f"--out {out}: not writable"
    if out.exists() and not is_result_file(out):
        return (
            f"--out {out} exists and is not a results file of `trialbox run` "
            "(resume writes into it): choose another path, or delete it"
        )
    return None


def _output_problems(tasks: Path, samples: Path, out: Path, traces_dir: Path | None) -> list[str]:
    """Why the results could not be written where asked: found before anything runs."""
    problems = [p for p in [_out_problem(tasks, samples, out)] if p]
    if traces_dir is not None and traces_dir.exists() and not traces_dir.is_dir():
        problems.append(f"--traces-dir {traces_dir} is a file: give a directory")
    return problems


@contextmanager
def _stop_on_signals(driver: Driver) -> Iterator[None]:
    """The first SIGINT/SIGTERM stops submitting; a second one quits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        if driver.stopping:
            raise KeyboardInterrupt
        driver.stopping = True
        err.print(
            f"stopping: no more submissions; waiting up to {GRACE_S:g} s for "
            f"{len(driver.in_flight)} sample(s) in flight (Ctrl-C again to quit now)"
        )

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_job(
    tasks: Path,
    samples: Path,
    out: Path,
    *,
    local: bool = False,
    endpoint_url: str | None = None,
    stack: str | None = None,
    run_id: str | None = None,
    concurrency: int | None = None,
    traces_dir: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> int:
    problems = []
    try:
        _, sample_list = load_tasks_and_samples(tasks, samples)
    except InputError as exc:
        problems.append(str(exc))
    problems += _output_problems(tasks, samples, out, traces_dir)
    if not problems:
        try:
            remote = _remote_client(local, endpoint_url, stack)
        except InputError as exc:
            problems.append(str(exc))
    if problems:
        err.print("\n".join(f"error: {p}" for p in problems))
        return 2
    run_id = run_id or uuid.uuid4().hex[:12]
    taskset, version = taskset_version(tasks)
    requests = [to_request(s, taskset, version, run_id) for s in sample_list]
    by_id = {r.request_id: s for r, s in zip(requests, sample_list, strict=True)}
    rows = {rid: row for rid, row in finished_ids(out).items() if rid in by_id}
    failure: str | None = None
    if rows:
        err.print(
            f"resuming run {run_id}: {len(rows)} of {len(requests)} sample(s) already "
            f"have results in {out}"
        )
    if len(rows) == len(requests) and remote is not None:
        remote.close()
    if len(rows) < len(requests):  # else nothing to run: no twin to start
        push = (taskset_key(taskset, version), tasks.read_bytes())
        failure, traces_dir = _execute(
            remote, requests, by_id, rows, out, push, traces_dir, concurrency, timeout_s
        )
    ordered = [rows[r.request_id] for r in requests if r.request_id in rows]
    write_atomically(out, "".join(json.dumps(row) + "\n" for row in ordered))
    _print_summary(ordered, len(requests), out, traces_dir)
    missing = len(requests) - len(ordered)
    if failure:
        err.print(f"error: {failure}")
    elif missing:  # the run's timeout passed
        err.print(
            f"error: {missing} sample(s) had no terminal result within --timeout {timeout_s:g} s "
            "(slow samples, or a stalled pipeline: a deployment's DLQs say which)"
        )
    if missing:
        command = [*_program(), "run", "--tasks", str(tasks), "--samples", str(samples)]
        command += ["--out", str(out), "--run-id", run_id]
        command += ["--local"] if local else []
        command += ["--endpoint-url", endpoint_url] if endpoint_url else []
        command += ["--stack", stack] if stack else []
        command += ["--concurrency", str(concurrency)] if concurrency else []
        command += ["--traces-dir", str(traces_dir)] if traces_dir else []
        command += ["--timeout", f"{timeout_s:g}"] if timeout_s != DEFAULT_TIMEOUT_S else []
        err.print(f"{missing} sample(s) have no result yet. Resume with:\n  {shlex.join(command)}")
    return 1 if (failure or missing) else 0


def _execute(
    remote: Client | None,
    requests: list[ExecutionRequest],
    by_id: dict[str, Sample],
    rows: dict[str, dict[str, Any]],
    out: Path,
    taskset: tuple[str, bytes],
    traces_dir: Path | None,
    concurrency: int | None,
    timeout_s: float,
) -> tuple[str | None, Path | None]:
    """Push the task set (key, body), then submit what has no row yet, appending each result
    to `rows` and to the output as it arrives. Returns why it stopped early (or None) and
    where traces went."""
    failure = None
    with ResultLog(out) as log:
        try:
            if remote is None:
                err.print("starting the local twin (moto + bwrap sandboxes)...")
            with remote or Client.local() as client:
                if traces_dir is None and client.is_local:
                    traces_dir = out.with_suffix(".traces")  # the twin's S3 goes with it
                client.push_taskset(*taskset)
                capacity = client.capacity
                limit = concurrency or default_concurrency(capacity)
                todo = [r for r in requests if r.request_id not in rows]
                with Progress(console=err, transient=True) as progress:
                    bar = progress.add_task("samples", total=len(requests), completed=len(rows))

                    def record(rid: str, result: ExecutionResult, elapsed: float | None) -> None:
                        rows[rid] = result_line(by_id[rid], rid, result, elapsed)
                        log.append(rows[rid])
                        if traces_dir is not None and result.trace_uri:
                            _save_trace(client, result.trace_uri, traces_dir / f"{rid}.json")
                        progress.advance(bar)

                    driver = Driver(client, todo, concurrency=limit, on_result=record)
                    if _drive(driver, timeout_s):
                        failure = "interrupted"
        except TrialboxError as exc:
            failure = str(exc)
        except KeyboardInterrupt:
            failure = "interrupted"
    return failure, traces_dir


def _drive(driver: Driver, timeout_s: float) -> bool:
    """Run to the end, or on SIGINT/SIGTERM stop submitting and wait a grace for what is in
    flight. True when stopped early with samples left."""
    with _stop_on_signals(driver):
        driver.collect_recorded()
        driver.run(timeout_s)
        if driver.stopping:
            driver.drain(GRACE_S)
    return driver.stopping and bool(driver.waiting or driver.in_flight)


def _program() -> list[str]:
    """This command as it was started, so that the resume line runs as printed."""
    if Path(sys.argv[0]).name == "trialbox":
        return [sys.argv[0]]
    return [sys.executable, "-m", "trialbox"]


def _save_trace(client: Client, uri: str, dest: Path) -> None:
    try:
        body = client.read_object(uri)
    except TrialboxError as exc:  # the result is kept; only the local copy is missing
        err.print(f"warning: trace {uri} not downloaded: {exc}")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(body)


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


def _print_summary(
    rows: list[dict[str, Any]], total: int, out: Path, traces_dir: Path | None
) -> None:
    console = Console(soft_wrap=True, markup=False, highlight=False)
    if rows and len(rows) <= PER_SAMPLE_ROWS:  # a small run: each sample's outcome at a glance
        console.print(_sample_table(rows, console.width))
    stats = summary(rows)
    table = Table(title=f"{len(rows)}/{total} samples")
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
    if traces_dir is not None:
        where = f"{traces_dir}/ (one <request_id>.json per sample)"
    else:
        where = ", ".join(sorted({r["trace_uri"].rsplit("/", 1)[0] + "/" for r in rows
                                  if r.get("trace_uri")})) or "none"  # fmt: skip
    console.print(f"results: {out}")
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
    raise typer.Exit(run_job(tasks, samples, out, local=local, endpoint_url=endpoint_url,
                             stack=stack, run_id=run_id, concurrency=concurrency,
                             traces_dir=traces_dir, timeout_s=timeout))  # fmt: skip


def demo_command(
    out: Annotated[Path, typer.Option(help="where the results go")] = Path("demo-results.jsonl"),
) -> None:
    """The bundled example task set on the local twin."""
    tasks, samples = EXAMPLES / "demo.jsonl", EXAMPLES / "demo-samples.jsonl"
    if not tasks.exists():
        typer.echo("the example task set ships with a checkout: examples/tasksets/", err=True)
        raise typer.Exit(2)
    code = run_job(tasks, samples, out, local=True, run_id=f"demo-{uuid.uuid4().hex[:8]}")
    sys.stdout.flush()
    raise typer.Exit(code)
