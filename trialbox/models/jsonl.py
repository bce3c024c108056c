"""Load tasks.jsonl and samples.jsonl in full, collecting every error with its line and field."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trialbox.errors import InvalidInputFiles, LineError
from trialbox.models.sample import Sample, written_by_policy
from trialbox.models.task import Task

M = TypeVar("M", bound=BaseModel)


# pydantic names a union's members in an error's location: they mean nothing to a user.
def _is_union_member(part: int | str) -> bool:
    return isinstance(part, str) and (part == "str" or part.startswith("function-after["))


FILE_SHAPE = 'a file is a text string, or an object {"base64": "...", "mode": "0644"}'


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('files', '../x.py', '[key]') -> 'files["../x.py"]'; ('commands', 0) -> 'commands[0]';
    () -> '' (the record as a whole: its message names what it is about)."""
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
    return path


def _value_at(raw: Any, loc: tuple[int | str, ...]) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _line_errors(name: str, number: int, raw: Any, exc: ValidationError) -> list[LineError]:
    found: list[LineError] = []
    shapes: set[str] = set()  # union fields whose value fits no member: one line each
    for err in exc.errors():
        loc = err["loc"]
        # The member tag follows the file's own name, which may itself look like one.
        member = next((i for i in range(len(loc) - 1, 0, -1) if _is_union_member(loc[i])), None)
        if member is not None:
            base = _field_path(loc[:member])
            if not isinstance(_value_at(raw, loc[:member]), dict):
                if base not in shapes:
                    shapes.add(base)
                    found.append(LineError(name, number, base, FILE_SHAPE))
                continue
            if loc[member] == "str":
                continue  # an object fails the text member too: only the object's errors help
            loc = loc[:member] + loc[member + 1 :]  # the tag means nothing to a user
        reason = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            reason = "unknown field" + (
                " (put free-form data under 'metadata')" if len(loc) == 1 else ""
            )
        found.append(LineError(name, number, _field_path(loc) or None, reason))
    return found or [LineError(name, number, None, "invalid record")]


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"duplicate key {', '.join(map(repr, repeated))}")
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _decode(path: Path, errors: list[LineError]) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        errors.append(LineError(str(path), None, None, "no such file"))
    except IsADirectoryError:
        errors.append(LineError(str(path), None, None, "is a directory, not a JSONL file"))
    except OSError as exc:
        errors.append(LineError(str(path), None, None, f"cannot be read ({exc.strerror})"))
    else:
        try:
            return data.decode("utf-8-sig")  # a leading byte-order mark is harmless
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
            errors.append(
                LineError(
                    path.name, line, None, f"not UTF-8 text ({exc.reason} at column {column})"
                )
            )
    return None


def _read_jsonl(
    path: Path,
    model: type[M],
    errors: list[LineError],
    invalid_ids: set[str] | None = None,
    ungradable: dict[tuple[str, str], str] | None = None,
) -> list[tuple[int, M]] | None:
    """The valid records by line number, or None when the file cannot be read at all.
    `invalid_ids` collects the task_id of lines that failed validation, when it has one.
    `ungradable` (samples): a line valid but for what the policy wrote (its files and
    commands) is kept with none of them, and the reason goes there: the sample's 0, not an
    error that stops the whole file."""
    name = path.name
    before = len(errors)
    text = _decode(path, errors)
    if text is None:
        return None
    records: list[tuple[int, M]] = []
    # Only "\n" ends a record: U+2028 and friends are legal raw inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(
                line, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants
            )
        except json.JSONDecodeError as exc:
            errors.append(
                LineError(name, number, None, f"bad JSON: {exc.msg} at column {exc.colno}")
            )
            continue
        except ValueError as exc:
            errors.append(LineError(name, number, None, f"bad JSON: {exc}"))
            continue
        if not isinstance(raw, dict):
            errors.append(LineError(name, number, None, "each line must be a JSON object"))
            continue
        try:
            records.append((number, model.model_validate(raw)))
        except ValidationError as exc:
            if ungradable is not None and written_by_policy(exc):
                with contextlib.suppress(ValidationError):
                    kept = model.model_validate(raw | {"files": {}, "commands": []})
                    records.append((number, kept))
                    found = _line_errors(name, number, raw, exc)
                    reasons = [f"{e.field}: {e.reason}" for e in found]
                    key = (str(raw["task_id"]), str(raw["sample_id"]))
                    ungradable[key] = "; ".join(reasons)[:2000]
                    continue
            if invalid_ids is not None and isinstance(raw.get("task_id"), str):
                invalid_ids.add(raw["task_id"])
            errors.extend(_line_errors(name, number, raw, exc))
    if not records and len(errors) == before:
        errors.append(LineError(name, None, None, "the file has no records"))
    return records


def _read_tasks(
    tasks_path: Path, task_errors: list[LineError], invalid_tasks: set[str]
) -> tuple[list[tuple[int, Task]] | None, dict[str, int]]:
    """The tasks file's records (None: unreadable) and each task id's first line."""
    tasks = _read_jsonl(tasks_path, Task, task_errors, invalid_tasks)
    task_ids: dict[str, int] = {}
    for number, task in tasks or []:
        if task.task_id in task_ids:
            task_errors.append(
                LineError(
                    tasks_path.name,
                    number,
                    "task_id",
                    f"duplicate task_id {task.task_id!r} (first on line {task_ids[task.task_id]})",
                )
            )
        task_ids.setdefault(task.task_id, number)
    return tasks, task_ids


def load_tasks(tasks_path: Path) -> list[Task]:
    """Validate a tasks file fully; raise `InvalidInputFiles` listing every error."""
    errors: list[LineError] = []
    tasks, _ = _read_tasks(tasks_path, errors, set())
    if errors:
        raise InvalidInputFiles(sorted(errors, key=lambda e: e.line or 0))
    return [task for _, task in tasks or []]


def load_tasks_and_samples(
    tasks_path: Path, samples_path: Path
) -> tuple[list[Task], list[Sample], dict[tuple[str, str], str]]:
    """Validate both files fully; raise `InvalidInputFiles` listing every error, or return
    both and the samples whose files or commands cannot be graded, by (task_id, sample_id),
    with why (kept in the samples without them: each scores 0, see `ungradable`)."""
    task_errors: list[LineError] = []
    sample_errors: list[LineError] = []
    invalid_tasks: set[str] = set()
    tasks, task_ids = _read_tasks(tasks_path, task_errors, invalid_tasks)
    ungradable: dict[tuple[str, str], str] = {}
    samples = _read_jsonl(samples_path, Sample, sample_errors, ungradable=ungradable)
    # A tasks file that could not be read at all says nothing about which task ids exist.
    tasks_known = tasks is not None
    seen: dict[tuple[str, str], int] = {}
    for number, sample in samples or []:
        key = (sample.task_id, sample.sample_id)
        unknown = sample.task_id not in task_ids and sample.task_id not in invalid_tasks
        if tasks_known and unknown:
            sample_errors.append(
                LineError(
                    samples_path.name,
                    number,
                    "task_id",
                    f"task {sample.task_id!r} is not in {tasks_path.name}",
                )
            )
        if key in seen:
            sample_errors.append(
                LineError(
                    samples_path.name,
                    number,
                    "sample_id",
                    f"duplicate (task_id, sample_id) {key} (first on line {seen[key]})",
                )
            )
        seen.setdefault(key, number)
    errors = sorted(task_errors, key=lambda e: e.line or 0)  # stable: field order
    errors += sorted(sample_errors, key=lambda e: e.line or 0)
    if errors:
        raise InvalidInputFiles(errors)
    assert tasks is not None and samples is not None
    return [task for _, task in tasks], [sample for _, sample in samples], ungradable
