"""What the SDK's entry points take, read in one place: a task as a `Task`, a task ref, or a
plain dict of the task's JSON (as a dataset row gives it), and a request as an
`ExecutionRequest` or its JSON. A bad one is an InputError at the call, naming the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from trialbox.errors import InputError
from trialbox.models import ExecutionRequest, Task
from trialbox.models.common import check_text
from trialbox.models.sample import TaskRef

TaskInput = Task | str | Mapping[str, Any]
"""A task as the SDK takes it: a Task, a pushed task's ref (`name@version/task_id`), or the
task's JSON as a dict."""
RequestInput = ExecutionRequest | Mapping[str, Any]
"""A request as `submit` and `run` take it: an ExecutionRequest, or its JSON as a dict."""

M = TypeVar("M", bound=BaseModel)
MAX_REF_CHARS = 1024
"""A task ref names an S3 key (at most 1024 bytes) and a task id."""


def task_or_ref(task: object, field: str = "task") -> Task | str:
    """The task, or the ref naming it (read when used); InputError naming `field` when it is
    neither a well-formed ref nor a valid task."""
    if isinstance(task, str):
        if len(task) > MAX_REF_CHARS:  # never echoed whole: a dataset cell may be megabytes
            raise InputError(
                f"{field}: a task ref of {len(task)} characters (at most {MAX_REF_CHARS}): "
                f"{task[:60]!r}..."
            )
        try:
            TaskRef.parse(task)
            check_text(task, f"task ref {task!r}")  # it names an S3 key: text, no controls
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in task):
                raise ValueError(f"task ref {task!r} holds a control character")
        except ValueError as exc:
            raise InputError(f"{field}: {exc}") from None
        return task
    return as_task(task, field, refs=True)


def as_task(task: object, field: str = "task", *, refs: bool = False) -> Task:
    """A Task from a Task or its JSON as a dict; InputError naming the field otherwise."""
    expected = "a Task, a task ref (name@version/task_id) or" if refs else "a Task or"
    return _model(Task, task, field, f"{expected} the task's JSON as a dict")


def as_tasks(tasks: object, field: str = "tasks") -> list[Task]:
    """Tasks built in code (each a Task or its JSON as a dict), as `push_tasks` takes them:
    a task set, so each task_id once (as a tasks file must have it)."""
    read = [as_task(t, f"{field}[{i}]") for i, t in enumerate(_sequence(tasks, field))]
    first: dict[str, int] = {}
    for index, task in enumerate(read):
        seen = first.setdefault(task.task_id, index)
        if seen != index:
            raise InputError(
                f"{field}[{index}].task_id: duplicate task_id {task.task_id!r} "
                f"(first at {field}[{seen}])"
            )
    return read


def as_requests(requests: object, field: str = "requests") -> list[ExecutionRequest]:
    """Requests (each an ExecutionRequest or its JSON as a dict), as `submit` takes them."""
    return [
        _model(ExecutionRequest, r, f"{field}[{i}]", "an ExecutionRequest or its JSON as a dict")
        for i, r in enumerate(_sequence(requests, field))
    ]


def _sequence(items: object, field: str) -> Sequence[object]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InputError(f"{field}: expected a list, got {type(items).__name__}")
    return items


def _model(model: type[M], value: object, field: str, expected: str) -> M:
    """The plain `model`: an instance of it as it is, a subclass's (fields of its own that
    the pipeline would refuse) or a dict validated as the model, located at `field`."""
    if type(value) is model:
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump() | (value.model_extra or {})
    if not isinstance(value, Mapping):
        raise InputError(f"{field}: expected {expected}, got {type(value).__name__}")
    try:
        read = model.model_validate(dict(value))
        read.model_dump_json()  # it travels as JSON: what cannot be written is refused here
    except ValidationError as exc:
        raise InputError(located(exc, field)) from None
    except (PydanticSerializationError, ValueError, RecursionError) as exc:
        raise InputError(f"{field}: cannot be written as JSON ({str(exc)[:200]})") from None
    return read


def located(exc: ValidationError, field: str) -> str:
    """Pydantic's errors worded for a user, each at its place under `field`
    (`task.grading.scorer: Input should be ...`; `field` "" for a method's own arguments)."""
    parts = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        place = f"{field}{where}".removeprefix(".") or "(input)"
        parts.append(f"{place}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
