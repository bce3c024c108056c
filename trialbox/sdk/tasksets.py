"""Task sets as the SDK pushes them, and request ids as it derives them."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialbox.errors import InputError
from trialbox.models import Task


@dataclass(frozen=True)
class TaskSetRef:
    """A pushed task set: `name@version`, the version being the file's sha256 (immutable)."""

    name: str
    version: str

    @classmethod
    def of_file(cls, path: Path) -> TaskSetRef:
        """The ref `push_taskset(path)` gives: the file's stem, at its sha256."""
        return taskset_ref(path.stem, path.read_bytes())

    def task(self, task_id: str) -> str:
        """The task ref string a request names: `name@version/task_id`."""
        return f"{self.name}@{self.version}/{task_id}"

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


def taskset_name(stem: str) -> str:
    """A file stem as a task set name: characters outside [A-Za-z0-9_.-] become '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem) or "tasks"


def taskset_ref(name: str, body: bytes) -> TaskSetRef:
    return TaskSetRef(taskset_name(name), hashlib.sha256(body).hexdigest())


def tasks_body(tasks: list[Task]) -> bytes:
    """Tasks as a task set file (JSONL), for tasks built in code."""
    return "".join(task.model_dump_json(exclude_defaults=True) + "\n" for task in tasks).encode()


def taskset_rows(body: bytes, name: str) -> dict[str, tuple[int, Any]]:
    """A pushed task set's rows by task id, with their line numbers, read as the pipeline
    reads them (its Prepare step): the first row of an id counts, a row without a string
    task_id names no task, and a line that is not JSON makes the whole set unreadable (an
    InputError naming the set and the line). Each row is validated when it is used."""
    rows: dict[str, tuple[int, Any]] = {}
    for number, line in enumerate(body.decode(errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):  # nested too deep to parse is no JSON either
            raise InputError(f"task set {name}: line {number} is not JSON") from None
        if isinstance(raw, dict) and isinstance(raw.get("task_id"), str):
            rows.setdefault(raw["task_id"], (number, raw))
    return rows


def request_id(run_id: str, task_id: str, sample_id: str) -> str:
    """Stable, unique and a valid execution name (^[A-Za-z0-9_-]{1,80}$): a readable prefix
    and a hash of the three parts."""
    digest = hashlib.sha256(f"{run_id}\0{task_id}\0{sample_id}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_-]", "-", f"{run_id}-{task_id}-{sample_id}")[:63]
    return f"{readable}-{digest}"
