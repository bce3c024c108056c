"""What the SDK's entry points take, read in one place: a task as a `Task`, a task ref, or a
plain dict of the task's JSON (as a dataset row gives it), and a request as an
`ExecutionRequest` or its JSON. A bad one is an InputError at the call, naming the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

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


def task_or_ref(task: object, field: str = "task") -> Task | str:
    """The task, or the ref naming it (read when used); InputError naming `field` when it is
    neither a well-formed ref nor a valid task."""
    if isinstance(task, str):
        try:
            TaskRef.parse(task)
            check_text(task, f"task ref {task!r}")  # it names an S3 key: text, no controls
            if any(ord(ch) < 32 for ch in task):
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
    """Tasks built in code (each a Task or its JSON as a dict), as `push_tasks` takes them."""
    return [as_task(t, f"{field}[{i}]") for i, t in enumerate(_sequence(tasks, field))]


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
    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise InputError(f"{field}: expected {expected}, got {type(value).__name__}")
    try:
        return model.model_validate(dict(value))
    except ValidationError as exc:
        raise InputError(located(exc, field)) from None


def located(exc: ValidationError, field: str) -> str:
    """Pydantic's errors worded for a user, each at its place under `field`
    (`task.grading.scorer: Input should be ...`; `field` "" for a method's own arguments)."""
    parts = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        place = f"{field}{where}".removeprefix(".") or "(input)"
        parts.append(f"{place}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
