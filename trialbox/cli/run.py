"""`trialbox run` and `trialbox demo`: every sample through the pipeline, one result each."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trialbox.client import Client, Resources
from trialbox.errors import InputError, TrialboxError
from trialbox.models.jsonl import load_tasks_and_samples
from trialbox.pipeline.prepare import taskset_key
from trialbox.runs import finished_ids, result_line, summary, taskset_version, to_request

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasksets"
err = Console(stderr=True)


def _client(local: bool, endpoint_url: str | None, stack: str | None) -> Client:
    endpoint = endpoint_url or os.environ.get("TRIALBOX_ENDPOINT_URL")
    if not local and endpoint:
        return Client(endpoint_url=endpoint)
    if not local and stack:
        import boto3

        described = boto3.client("cloudformation").describe_stacks(StackName=stack)
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Stacks"][0]["Outputs"]}
        return Client(Resources.from_outputs(outputs))
    err.print("starting the local twin (moto + bwrap sandboxes)...")
    return Client.local()


def run_job(
    tasks: Path,
    samples: Path,
    out: Path,
    *,
    local: bool = False,
    endpoint_url: str | None = None,
    stack: str | None = None,
    run_id: str | None = None,
    timeout_s: float = 3600,
) -> int:
    try:
        _, sample_list = load_tasks_and_samples(tasks, samples)
    except InputError as exc:
        err.print(f"error: {exc}", markup=False)
        return 2
    run_id = run_id or uuid.uuid4().hex[:12]
    taskset, version = taskset_version(tasks)
    requests = [to_request(s, taskset, version, run_id) for s in sample_list]
    done = finished_ids(out)
    todo = [r for r in requests if r.request_id not in done]
    rows: dict[str, dict[str, Any]] = dict(done)
    interrupted = False
    try:
        with _client(local, endpoint_url, stack) as client:
            client.push_taskset(taskset_key(taskset, version), tasks.read_bytes())
            submitted: dict[str, float] = {}
            by_id = {r.request_id: (r, s) for r, s in zip(requests, sample_list, strict=True)}
            with Progress(console=err, transient=True) as progress:
                bar = progress.add_task("samples", total=len(requests), completed=len(done))
                try:
                    for start in range(0, len(todo), 10):
                        batch = todo[start : start + 10]
                        client.submit(batch)
                        for r in batch:
                            submitted[r.request_id] = time.monotonic()
                    deadline = time.monotonic() + timeout_s
                    pending = [r.request_id for r in todo]
                    while pending and time.monotonic() < deadline:
                        for rid, result in client.poll(pending).items():
                            sample = by_id[rid][1]
                            elapsed = time.monotonic() - submitted[rid]
                            rows[rid] = result_line(sample, rid, result, elapsed)
                            progress.advance(bar)
                        pending = [rid for rid in pending if rid not in rows]
                        if pending:
                            time.sleep(0.3)
                except KeyboardInterrupt:
                    interrupted = True
                    grace = time.monotonic() + 5
                    pending = [r.request_id for r in todo if r.request_id not in rows]
                    while pending and time.monotonic() < grace:
                        for rid, result in client.poll(pending).items():
                            elapsed = time.monotonic() - submitted.get(rid, time.monotonic())
                            rows[rid] = result_line(by_id[rid][1], rid, result, elapsed)
                        pending = [rid for rid in pending if rid not in rows]
                        time.sleep(0.3)
    except TrialboxError as exc:
        err.print(f"error: {exc}", markup=False)
        return 1
    ordered = [rows[r.request_id] for r in requests if r.request_id in rows]
    out.write_text("".join(json.dumps(row) + "\n" for row in ordered))
    _print_summary(ordered, len(requests), out)
    missing = len(requests) - len(ordered)
    if interrupted or missing:
        command = ["trialbox", "run", "--tasks", str(tasks), "--samples", str(samples)]
        command += ["--out", str(out), "--run-id", run_id]
        err.print(f"{missing} sample(s) have no result yet. Resume with:\n  {shlex.join(command)}")
        return 1
    return 0


def _print_summary(rows: list[dict[str, Any]], total: int, out: Path) -> None:
    stats = summary(rows)
    table = Table(title=f"{len(rows)}/{total} samples")
    table.add_column("status")
    table.add_column("count", justify="right")
    for status, count in sorted(stats["counts"].items()):
        table.add_row(status, str(count))
    console = Console()
    console.print(table)
    mean = stats["mean_reward"]
    console.print(
        f"mean reward {mean:.3f}" if mean is not None else "mean reward n/a",
        f"| latency p50 {stats['p50_s']} s, p95 {stats['p95_s']} s" if rows else "",
    )
    traces = sorted({r["trace_uri"].rsplit("/", 1)[0] for r in rows if r.get("trace_uri")})
    console.print(f"results: {out}" + (f"   traces: {', '.join(traces)}/" if traces else ""))


def run_command(
    tasks: Annotated[Path, typer.Option(help="tasks.jsonl")],
    samples: Annotated[Path, typer.Option(help="samples.jsonl")],
    out: Annotated[Path, typer.Option(help="results, one JSON line per sample")],
    local: Annotated[bool, typer.Option("--local", help="force the local twin")] = False,
    endpoint_url: Annotated[str | None, typer.Option(help="AWS or twin endpoint")] = None,
    stack: Annotated[str | None, typer.Option(help="a deployed stack's name")] = None,
    run_id: Annotated[str | None, typer.Option(help="reuse to resume a run")] = None,
    concurrency: Annotated[int, typer.Option(help="reserved: the pool sets it")] = 0,
) -> None:
    """Run every sample through the pipeline; write one result per sample, in input order."""
    del concurrency
    raise typer.Exit(run_job(tasks, samples, out, local=local, endpoint_url=endpoint_url,
                             stack=stack, run_id=run_id))  # fmt: skip


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
