"""The run job behind `trialbox run` and `trialbox demo`: validate the input and the output
path, resume from an earlier output file, run every sample through the SDK's `Client`, append
each result line as it arrives, and summarize. The CLI (`trialbox.cli.run`) only draws it."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from trialbox.errors import (
    InputError,
    MissingResources,
    TrialboxError,
    WaitTimeout,
)
from trialbox.models import ExecutionRequest, ExecutionResult, Sample, Status
from trialbox.models import ungradable as ungradable_result
from trialbox.models.jsonl import load_tasks_and_samples
from trialbox.sdk import Client, Handle, TaskSetRef, request_id
from trialbox.sdk.core import local_twin_class
from trialbox.settings import ClientSettings

TERMINAL = {s.value for s in Status}
DEFAULT_TIMEOUT_S = 3600.0


def to_request(sample: Sample, taskset: TaskSetRef, run_id: str) -> ExecutionRequest:
    return ExecutionRequest(
        request_id=request_id(run_id, sample.task_id, sample.sample_id),
        run_id=run_id,
        task_ref=taskset.task(sample.task_id),
        sample_id=sample.sample_id,
        files=sample.files,
        commands=sample.commands,
        metadata=sample.metadata,
    )


def is_result_file(out: Path) -> bool:
    """Empty, or result rows, one per line: only a last line with no newline, which a killed
    run cut short, may be anything."""
    try:
        text = out.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    lines = text.splitlines()
    if not text.endswith("\n"):
        lines = lines[:-1]
        if not lines and text:  # a single unterminated line is a file of something else
            return False
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            return False
        if not (isinstance(row, dict) and "request_id" in row and "status" in row):
            return False
    return True


def finished_ids(out: Path) -> dict[str, dict[str, Any]]:
    """Lines of a previous run that already have a terminal result, by request id."""
    done: dict[str, dict[str, Any]] = {}
    if not out.exists():
        return done
    for line in out.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("status") in TERMINAL and row.get("request_id"):
            done[row["request_id"]] = row
    return done


class ResultLog:
    """Appends each result line as it arrives, so that a killed run keeps what finished; the
    caller rewrites the file in input order at the end (`write_atomically`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def append(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def result_line(
    sample: Sample, request: ExecutionRequest, result: ExecutionResult, duration_s: float | None
) -> dict[str, Any]:
    return {
        "task_id": sample.task_id,
        "sample_id": sample.sample_id,
        "request_id": request.request_id,
        "content_sha256": request.content_sha256(),  # a resume checks the sample is unchanged
        "status": result.status.value,
        "reward": result.reward,
        "loss_mask": result.loss_mask,
        "tests_passed": result.tests_passed,
        "tests_expected": result.tests_expected,
        "duration_s": None if duration_s is None else round(duration_s, 3),
        "feedback": result.feedback,
        "flags": result.flags,
        "error": result.error,
        "trace_uri": result.trace_uri,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [r["reward"] for r in rows if r.get("reward") is not None]
    latencies = sorted(r["duration_s"] for r in rows if r.get("duration_s") is not None)

    def quantile(q: float) -> float | None:
        if not latencies:
            return None
        return float(latencies[min(len(latencies) - 1, int(q * len(latencies)))])

    return {
        "counts": dict(Counter(r["status"] for r in rows)),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "p50_s": quantile(0.5),
        "p95_s": quantile(0.95),
    }


def connect(
    local: bool, endpoint_url: str | None, stack: str | None, concurrency: int | None
) -> Client | None:
    """The deployment named by the options or the environment; None means the local twin.
    A target that cannot be reached as given is the user's to fix: InputError."""
    endpoint = endpoint_url or ClientSettings.from_env().endpoint_url
    try:
        if not local and endpoint:
            return Client(endpoint_url=endpoint, concurrency=concurrency)
        if not local and stack:
            return Client.from_stack(stack, concurrency=concurrency)
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


@dataclass
class RunJob:
    """One `trialbox run`: the options, then `prepare` (all validation, before anything
    starts) and `execute`."""

    tasks: Path
    samples: Path
    out: Path
    local: bool = False
    endpoint_url: str | None = None
    stack: str | None = None
    run_id: str | None = None
    concurrency: int | None = None
    traces_dir: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    warn: Callable[[str], None] = lambda message: None
    # Filled by prepare / execute:
    requests: list[ExecutionRequest] = field(default_factory=list)
    samples_by_id: dict[str, Sample] = field(default_factory=dict)
    requests_by_id: dict[str, ExecutionRequest] = field(default_factory=dict)
    twin_started: bool = False  # an in-process twin: its work in flight ends with the run
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed: int = 0
    failure: str | None = None
    _client: Client | None = None
    _handles: list[Handle] = field(default_factory=list)

    def prepare(self) -> list[str]:
        """Every problem with the input files, the output paths and the target, in words a
        user can act on; empty when the run can start. Nothing has run either way."""
        problems: list[str] = []
        sample_list: list[Sample] = []
        ungradable: dict[tuple[str, str], str] = {}
        try:
            _, sample_list, ungradable = load_tasks_and_samples(self.tasks, self.samples)
        except InputError as exc:
            problems.append(str(exc))
        problem = _out_problem(self.tasks, self.samples, self.out)
        problems += [problem] if problem else []
        traces = self.traces_dir
        if traces is not None and traces.exists() and not traces.is_dir():
            problems.append(f"--traces-dir {self.traces_dir} is a file: give a directory")
        if problems:
            return problems
        try:
            self._client = connect(self.local, self.endpoint_url, self.stack, self.concurrency)
            if self._client is None:
                local_twin_class()  # its extra is installed, or one line says which
        except TrialboxError as exc:
            return [str(exc)]
        self.run_id = self.run_id or uuid.uuid4().hex[:12]
        ref = TaskSetRef.of_file(self.tasks)
        self.requests = [to_request(s, ref, self.run_id) for s in sample_list]
        self.samples_by_id = {
            r.request_id: s for r, s in zip(self.requests, sample_list, strict=True)
        }
        self.requests_by_id = {r.request_id: r for r in self.requests}
        self.rows = {
            rid: row for rid, row in finished_ids(self.out).items() if rid in self.samples_by_id
        }
        changed = [
            self.samples_by_id[rid]
            for rid, row in self.rows.items()
            if row.get("content_sha256") not in (None, self.requests_by_id[rid].content_sha256())
        ]
        if changed:
            return [
                f"{len(changed)} sample(s) changed since run {self.run_id} recorded them in "
                f"{self.out} (first: task {changed[0].task_id!r}, sample "
                f"{changed[0].sample_id!r}, or its task): give a new --run-id to run them"
            ]
        self.resumed = len(self.rows)
        for rid, sample in self.samples_by_id.items():  # what it wrote cannot run: its 0
            reason = ungradable.get((sample.task_id, sample.sample_id))
            if reason is not None and rid not in self.rows:
                result = ungradable_result(rid, sample.task_id, sample.sample_id, reason)
                self.rows[rid] = result_line(sample, self.requests_by_id[rid], result, None)
        return []

    @property
    def todo(self) -> list[ExecutionRequest]:
        return [r for r in self.requests if r.request_id not in self.rows]

    def execute(
        self, on_result: Callable[[dict[str, Any]], None], starting: Callable[[], None]
    ) -> None:
        """Run what has no row yet, appending each result to the output as it arrives; then
        rewrite the output in input order. Sets `failure` when it stopped early."""
        if not self.todo:  # nothing left: no twin to start
            if self._client is not None:
                self._client.close()
            self._finish()
            return
        with ResultLog(self.out) as log:
            try:
                if self._client is None:
                    starting()
                    self._client = Client.local(concurrency=self.concurrency)
                    self.twin_started = True
                with self._client as client:
                    if self.traces_dir is None and client.is_local:
                        self.traces_dir = self.out.with_suffix(".traces")  # the twin's S3 goes
                    client.push_taskset(self.tasks)
                    self._handles = client.submit(self.todo)
                    for handle in client.as_completed(self._handles, timeout=self.timeout_s):
                        self._take(client, handle, log, on_result)
            except WaitTimeout:
                pass  # the missing samples are counted and a resume command printed
            except TrialboxError as exc:
                self.failure = str(exc)
            except KeyboardInterrupt:
                self.failure = "interrupted"
        self._finish()

    def _take(
        self,
        client: Client,
        handle: Handle,
        log: ResultLog,
        on_result: Callable[[dict[str, Any]], None],
    ) -> None:
        result = handle.result()
        if result.status == Status.CANCELLED and not handle.sent:
            return  # withdrawn, never sent: it runs when the run is resumed
        rid = handle.request_id
        request = self.requests_by_id[rid]
        self.rows[rid] = result_line(self.samples_by_id[rid], request, result, handle.latency_s)
        log.append(self.rows[rid])
        if self.traces_dir is not None and result.trace_uri:
            self._save_trace(client, result.trace_uri, self.traces_dir / f"{rid}.json")
        on_result(self.rows[rid])

    def interrupt(self) -> int:
        """Stop sending: the samples not yet sent are taken back (a resume runs them).
        Returns how many are still in flight."""
        self.failure = "interrupted"
        if self._client is None:
            return 0
        # Called from a signal handler, which may have interrupted the main thread inside a
        # future's lock: waiting on the client's loop here could deadlock, so do not wait.
        threading.Thread(target=self._client.withdraw, args=(self._handles,), daemon=True).start()
        return sum(1 for h in self._handles if h.sent and not h.done())

    def _save_trace(self, client: Client, uri: str, dest: Path) -> None:
        try:
            body = client.read_object(uri)
        except TrialboxError as exc:  # the result is kept; only the local copy is missing
            self.warn(f"trace {uri} not downloaded: {exc}")
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(body)

    def _finish(self) -> None:
        write_atomically(self.out, "".join(json.dumps(row) + "\n" for row in self.ordered))

    @property
    def ordered(self) -> list[dict[str, Any]]:
        return [self.rows[r.request_id] for r in self.requests if r.request_id in self.rows]

    @property
    def missing(self) -> int:
        return len(self.requests) - len(self.ordered)

    def resume_command(self) -> str:
        """This command as started, with --run-id: it runs exactly as printed."""
        program = [sys.argv[0]] if Path(sys.argv[0]).name == "trialbox" else [
            sys.executable, "-m", "trialbox"
        ]  # fmt: skip
        command = [*program, "run", "--tasks", str(self.tasks), "--samples", str(self.samples)]
        command += ["--out", str(self.out), "--run-id", str(self.run_id)]
        command += ["--local"] if self.local else []
        command += ["--endpoint-url", self.endpoint_url] if self.endpoint_url else []
        command += ["--stack", self.stack] if self.stack else []
        command += ["--concurrency", str(self.concurrency)] if self.concurrency else []
        command += ["--traces-dir", str(self.traces_dir)] if self.traces_dir else []
        # The in-process twin drops what was in flight: the same short timeout would again.
        if self.timeout_s != DEFAULT_TIMEOUT_S and not self.twin_started:
            command += ["--timeout", f"{self.timeout_s:g}"]
        return shlex.join(command)
