"""What the adapters share: task cells, test cases, completions and the None rule."""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest

from tests.support.tasks import ADD_TASK
from trialbox.errors import AwsCallError, InputError, SessionError
from trialbox.integrations.common import (
    Connection,
    completion_text,
    io_task,
    is_infrastructure_failure,
    rewards,
    task_of,
    task_or_cases,
)
from trialbox.models import Status, Task, result_for
from trialbox.sdk import Resources


def result(status: Status, reward: float | None = None) -> object:
    return result_for("r", status, scored_reward=reward)


def test_rewards_are_none_for_the_platforms_failures_and_a_whole_group_on_request() -> None:
    group = [result(Status.SUCCEEDED, 1.0), result(Status.SANDBOX_ERROR), result(Status.TIMEOUT)]
    assert rewards(group) == [1.0, None, 0.0]  # type: ignore[arg-type]
    assert rewards(group, mask_group=True) == [None, None, None]  # type: ignore[arg-type]
    clean = [result(Status.SUCCEEDED, 0.5), result(Status.OOM)]
    assert rewards(clean, mask_group=True) == [0.5, 0.0]  # type: ignore[arg-type]


def test_task_cells_are_refs_tasks_or_task_json_and_anything_else_says_so() -> None:
    assert task_of("set@v/t", "task_ref") == "set@v/t"
    assert isinstance(task_of(json.dumps(ADD_TASK), "task_ref"), Task)
    assert isinstance(task_of(ADD_TASK, "task_ref"), Task)
    with pytest.raises(InputError, match=r"column 'task_ref'.*hidden_tests"):
        task_of({"task_id": "x"}, "task_ref")
    with pytest.raises(InputError, match="column 'task_ref'"):
        task_of("{not json", "task_ref")


def test_test_cases_in_every_form_datasets_use_become_io_match_tasks() -> None:
    forms = [
        {"inputs": ["1\n"], "outputs": ["1\n"]},
        json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}),
        {"cases": [{"input": "1\n", "output": "1\n"}]},
        [{"input": "1\n", "output": "1\n"}],
    ]
    tasks = [task_or_cases(form, "ground_truth") for form in forms]
    assert all(isinstance(t, Task) and t.grading.scorer == "io_match" for t in tasks)
    assert len({t.task_id for t in tasks if isinstance(t, Task)}) == 1  # the same cases
    with pytest.raises(InputError, match="2 inputs but 1 outputs"):
        io_task({"inputs": ["1", "2"], "outputs": ["1"]})
    # As datasets store them: numbers, lists of lines, and keys beyond the cases.
    odd = io_task({"inputs": [1, ["1 2", "3"]], "outputs": [1, ["3", "4"]], "time_limit": 2})
    assert odd.grading.io is not None
    assert [(c.input, c.output) for c in odd.grading.io.cases] == [("1", "1"), ("1 2\n3", "3\n4")]
    call = io_task({"fn_name": "f", "inputs": [[1, "a"]], "outputs": [[2]]})  # APPS, call-based
    assert call.grading.io is not None and call.grading.io.fn_name == "f"
    assert call.grading.io.cases[0].model_dump() == {"input": '[1, "a"]', "output": "[2]"}
    with pytest.raises(InputError, match="JSON list of its arguments"):
        io_task({"fn_name": "f", "cases": [{"input": "1", "output": "1"}]})


def test_completions_are_text_or_the_last_message() -> None:
    assert completion_text("x") == "x"
    assert completion_text([{"role": "assistant", "content": "y"}]) == "y"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]
    assert completion_text(parts) == "ab"
    assert completion_text([{"role": "assistant", "content": "c"}, {"role": "tool"}]) == "c"
    assert completion_text(3) == completion_text(None) == ""  # no code: the sample's 0.0


def test_the_trainers_errors_raise_and_the_platforms_do_not() -> None:
    assert is_infrastructure_failure(AwsCallError("down"))
    assert is_infrastructure_failure(ConnectionRefusedError())
    assert not is_infrastructure_failure(InputError("bad"))
    assert not is_infrastructure_failure(SessionError("no task"))
    assert not is_infrastructure_failure(ValueError("a bug"))


def test_a_connection_pickles_without_a_live_client() -> None:
    resources = Resources("q", "t", "b", "s")
    connection = Connection(resources=resources, endpoint_url="http://127.0.0.1:1")
    assert pickle.loads(pickle.dumps(connection)) == connection
    assert Connection.of("my-stack") == Connection(stack="my-stack")
    with pytest.raises(InputError, match="expected a trialbox Client"):
        Connection.of(42)  # type: ignore[arg-type]


DEEP_JSON = "[" * 100_000 + "]" * 100_000


def test_a_dataset_cell_nested_too_deep_to_parse_is_an_input_error_naming_it() -> None:
    """Was a break: json.loads's RecursionError escaped task_of, task_or_cases and io_task
    (reached from every adapter's task cell), and io_task("not json") a JSONDecodeError."""
    deep_task = '{"task_id": ' + DEEP_JSON + "}"
    with pytest.raises(InputError, match=r"^column 'task': the task's JSON does not parse"):
        task_of(deep_task, "task")
    with pytest.raises(InputError, match=r"^column 'ground_truth': a task ref of 200000 char"):
        task_or_cases(DEEP_JSON, "ground_truth")
    with pytest.raises(InputError, match=r"^column 't': task ref 'a@v/t\\x7f' holds a control"):
        task_of("a@v/t\x7f", "t")
    with pytest.raises(InputError, match=r"^test cases: not JSON"):
        io_task(DEEP_JSON)
    with pytest.raises(InputError, match=r"^test cases: not JSON"):
        io_task("not json")


def test_trainer_adapters_refuse_a_row_field_that_is_not_a_dict_naming_it() -> None:
    """Was a break: verl's extra_info, SkyRL's extras and reward_spec given as a str or list
    raised AttributeError ('.get') or a raw ValueError; TrialboxReward's completions as a
    generator, or a task column of None, a raw TypeError (len)."""
    from trialbox.integrations.skyrl import TrialboxTextEnv
    from trialbox.integrations.trl import TrialboxReward
    from trialbox.integrations.verl import compute_score

    refused = {}
    for name, call in {
        "verl_extra_info": lambda: asyncio.run(compute_score("s", "x", None, "{}")),  # type: ignore[arg-type]
        "skyrl_extras": lambda: TrialboxTextEnv({"stack": "s"}, "task"),
        "skyrl_reward_spec": lambda: TrialboxTextEnv({"stack": "s"}, {"reward_spec": [1]}),
        "reward_column": lambda: TrialboxReward("s", task_column="task")(
            completions=["x"], task=None
        ),
        "reward_completions": lambda: TrialboxReward("s", task_column="task")(
            completions="x", task=[ADD_TASK]
        ),
    }.items():
        with pytest.raises(InputError) as caught:
            call()
        refused[name] = str(caught.value)
    assert refused == {
        "verl_extra_info": "extra_info: expected a dict, got str",
        "skyrl_extras": "extras: expected a dict, got str",
        "skyrl_reward_spec": "extras.reward_spec: expected a dict, got list",
        "reward_column": "column 'task': expected a list (one per sample), got NoneType",
        "reward_completions": "completions: expected a list (one per sample), got str",
    }
