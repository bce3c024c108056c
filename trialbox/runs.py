"""The main job's logic: task set push, request ids, resume, result lines and the summary."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from trialbox.models import ExecutionRequest, ExecutionResult, Sample, Status

TERMINAL = {s.value for s in Status}


def taskset_version(tasks_path: Path) -> tuple[str, str]:
    """`<file stem>@<sha256 of the file>`: content-addressed and immutable."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", tasks_path.stem)
    return stem, hashlib.sha256(tasks_path.read_bytes()).hexdigest()


def request_id(run_id: str, task_id: str, sample_id: str) -> str:
    """Stable, unique and a valid execution name (^[A-Za-z0-9_-]{1,80}$)."""
    digest = hashlib.sha256(f"{run_id}\0{task_id}\0{sample_id}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_-]", "-", f"{run_id}-{task_id}-{sample_id}")[:63]
    return f"{readable}-{digest}"


def to_request(sample: Sample, taskset: str, version: str, run_id: str) -> ExecutionRequest:
    return ExecutionRequest(
        request_id=request_id(run_id, sample.task_id, sample.sample_id),
        run_id=run_id,
        task_ref=f"{taskset}@{version}/{sample.task_id}",
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
    sample: Sample, rid: str, result: ExecutionResult, duration_s: float | None
) -> dict[str, Any]:
    return {
        "task_id": sample.task_id,
        "sample_id": sample.sample_id,
        "request_id": rid,
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
