"""Load tasks.jsonl and samples.jsonl in full, collecting every error with its line and field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from trialbox.errors import InputError
from trialbox.models.sample import Sample
from trialbox.models.task import Task

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class LineError:
    file: str
    line: int
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class InvalidInputFiles(InputError):
    def __init__(self, errors: list[LineError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {error}" for error in errors)
        super().__init__(f"{len(errors)} invalid line(s); nothing was run:\n{lines}")


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('files', '../x.py', '[key]') -> 'files["../x.py"]'; ('commands', 0) -> 'commands[0]'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":
            continue
        elif not part.isidentifier():
            path += f"[{json.dumps(part)}]"
        else:
            path += f".{part}" if path else part
    return path or "(record)"


def _read_jsonl(
    path: Path, model: type[M], errors: list[LineError], invalid_ids: set[str] | None = None
) -> list[tuple[int, M]]:
    """`invalid_ids` collects the task_id of lines that failed validation, when it has one."""
    name = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    records: list[tuple[int, M]] = []
    # Only "\n" ends a record: U+2028 and friends are legal raw inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(
                LineError(name, number, None, f"bad JSON: {exc.msg} at column {exc.colno}")
            )
            continue
        if not isinstance(raw, dict):
            errors.append(LineError(name, number, None, "each line must be a JSON object"))
            continue
        try:
            records.append((number, model.model_validate(raw)))
        except ValidationError as exc:
            if invalid_ids is not None and isinstance(raw.get("task_id"), str):
                invalid_ids.add(raw["task_id"])
            for err in exc.errors():
                reason = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    reason = "unknown field (put free-form data under 'metadata')"
                errors.append(LineError(name, number, _field_path(err["loc"]), reason))
    if not records and not errors:
        errors.append(LineError(name, 0, None, "the file has no records"))
    return records


def load_tasks_and_samples(tasks_path: Path, samples_path: Path) -> tuple[list[Task], list[Sample]]:
    """Validate both files fully; raise `InvalidInputFiles` listing every error, or return both."""
    errors: list[LineError] = []
    invalid_tasks: set[str] = set()
    tasks = _read_jsonl(tasks_path, Task, errors, invalid_tasks)
    samples = _read_jsonl(samples_path, Sample, errors)
    task_ids: dict[str, int] = {}
    for number, task in tasks:
        if task.task_id in task_ids:
            errors.append(
                LineError(
                    tasks_path.name,
                    number,
                    "task_id",
                    f"duplicate task_id {task.task_id!r} (first on line {task_ids[task.task_id]})",
                )
            )
        task_ids.setdefault(task.task_id, number)
    seen: dict[tuple[str, str], int] = {}
    for number, sample in samples:
        key = (sample.task_id, sample.sample_id)
        if sample.task_id not in task_ids and sample.task_id not in invalid_tasks:
            errors.append(
                LineError(
                    samples_path.name,
                    number,
                    "task_id",
                    f"task {sample.task_id!r} is not in {tasks_path.name}",
                )
            )
        if key in seen:
            errors.append(
                LineError(
                    samples_path.name,
                    number,
                    "sample_id",
                    f"duplicate (task_id, sample_id) {key} (first on line {seen[key]})",
                )
            )
        seen.setdefault(key, number)
    if errors:
        raise InvalidInputFiles(errors)
    return [task for _, task in tasks], [sample for _, sample in samples]
