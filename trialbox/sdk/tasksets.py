"""Task sets as the SDK pushes them, and request ids as it derives them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

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


def request_id(run_id: str, task_id: str, sample_id: str) -> str:
    """Stable, unique and a valid execution name (^[A-Za-z0-9_-]{1,80}$): a readable prefix
    and a hash of the three parts."""
    digest = hashlib.sha256(f"{run_id}\0{task_id}\0{sample_id}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_-]", "-", f"{run_id}-{task_id}-{sample_id}")[:63]
    return f"{readable}-{digest}"
