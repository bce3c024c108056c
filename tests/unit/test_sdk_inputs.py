"""The SDK's one reader of what its entry points take (trialbox.sdk.inputs): a task as a Task,
a ref or its JSON; a request as an ExecutionRequest or its JSON. Whatever is taken is the plain
model the pipeline reads; what is not is an InputError naming the field."""

from __future__ import annotations

import pytest

from tests.support.tasks import ADD_TASK
from trialbox.errors import InputError
from trialbox.models import ExecutionRequest, Task
from trialbox.sdk.inputs import as_requests, as_task, as_tasks, task_or_ref


class LabelledTask(Task):
    difficulty: str = "easy"


class TaskWithAMethod(Task):
    def label(self) -> str:
        return self.task_id.upper()


class TaggedRequest(ExecutionRequest):
    note: str = "n"


def test_a_subclass_with_fields_of_its_own_is_refused_at_the_call_naming_them() -> None:
    """Was a break: a Task subclass was accepted as it was and pushed with its extra field;
    the pipeline then refused the row, so every sample ended `rejected` (masked)."""
    labelled = LabelledTask.model_validate(ADD_TASK | {"difficulty": "hard"})
    for read in (
        lambda: as_task(labelled),
        lambda: task_or_ref(labelled),
        lambda: as_tasks([Task.model_validate(ADD_TASK), labelled]),
    ):
        with pytest.raises(InputError, match=r"difficulty: Extra inputs are not permitted"):
            read()
    with pytest.raises(InputError, match=r"tasks\[1\]\.difficulty"):
        as_tasks([Task.model_validate(ADD_TASK), labelled])
    request = TaggedRequest(request_id="r", task=Task.model_validate(ADD_TASK), files={})
    with pytest.raises(InputError, match=r"requests\[0\]\.note: Extra inputs"):
        as_requests([request])


def test_a_subclass_that_adds_no_field_is_read_as_the_plain_model() -> None:
    task = as_task(TaskWithAMethod.model_validate(ADD_TASK))
    assert type(task) is Task and task == Task.model_validate(ADD_TASK)
    (pushed,) = as_tasks([TaskWithAMethod.model_validate(ADD_TASK)])
    assert type(pushed) is Task


@pytest.mark.parametrize(
    "metadata",
    [{"x": object()}, {"x": b"\xff"}, {"x": [[[]]]}],
    ids=["an_object", "bytes_not_utf8", "nested"],
)
def test_a_request_whose_metadata_cannot_be_written_as_json_is_an_input_error(
    metadata: dict[str, object],
) -> None:
    """Was a break: metadata {"x": object()} raised PydanticSerializationError at submit,
    b"\\xff" a UnicodeDecodeError, 3000-deep metadata a RecursionError: none an InputError."""
    deep: object = "x"
    for _ in range(3000):
        deep = [deep]
    if metadata == {"x": [[[]]]}:
        metadata = {"x": deep}
    request = {"request_id": "r", "task": ADD_TASK, "metadata": metadata}
    with pytest.raises(InputError, match=r"^requests\[0\]"):
        as_requests([request])
