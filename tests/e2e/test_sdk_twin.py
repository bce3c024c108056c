"""The SDK's two faces, GRPO groups and cancel on the local twin, with real bwrap sandboxes."""

from __future__ import annotations

import asyncio
import time

from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task
from trialbox.models.batches import BatchInput
from trialbox.sdk import AsyncClient, Client, request_id
from trialbox.sdk.extract import NO_CODE_FEEDBACK, NO_CODE_FLAG

WRONG = "def add(a, b):\n    return 3\n"  # passes test_small only
BROKEN = "def add(a, b) return a + b\n"  # a syntax error: no test passes
SOLUTIONS = {"right": CORRECT, "wrong": WRONG, "broken": BROKEN}


def requests(prefix: str) -> list[ExecutionRequest]:
    return [request(f"{prefix}-{name}", code) for name, code in SOLUTIONS.items()]


def test_the_async_and_sync_clients_grade_alike(client: Client) -> None:
    """AsyncClient.local (a second twin, once) and the module's Client: the same requests
    (under other ids: ids are idempotency keys) get the same statuses and rewards."""

    async def run_async() -> list[ExecutionResult]:
        async with AsyncClient.local(workers=2) as local:
            assert local.is_local and local.capacity == 2 and local.concurrency == 8
            return await local.run(requests("tw-async"), timeout=180)

    from_async = asyncio.run(run_async())
    from_sync = client.run(requests("tw-sync"), timeout=180)
    graded = [(r.status, r.reward, r.loss_mask) for r in from_sync]
    assert graded == [
        (Status.SUCCEEDED, 1.0, False),
        (Status.SUCCEEDED, 0.5, False),
        (Status.SUCCEEDED, 0.0, False),
    ]
    assert [(r.status, r.reward, r.loss_mask) for r in from_async] == graded
    assert [r.tests_passed for r in from_async] == [r.tests_passed for r in from_sync] == [2, 1, 0]
    assert [r.request_id for r in from_async] == [f"tw-async-{name}" for name in SOLUTIONS]


def test_a_group_grades_each_completion_like_a_request_of_its_code(client: Client) -> None:
    task = Task.model_validate(ADD_TASK)
    assert [path for path in task.workspace if path.endswith(".py")] == ["solution.py"]
    completions = [
        f"Here is my solution:\n\n```python\n{CORRECT}```\n",
        f"I think this works:\n```python\n{WRONG}```",
        "I am not sure how to write this function.",
        f"Try this:\n\n```\n{CORRECT}```\n\nDone.",
    ]
    results = client.run_group(task, completions, group_id="tw-group", timeout=180)
    right, wrong = client.run(
        [request("tw-alone-right", CORRECT), request("tw-alone-wrong", WRONG)], timeout=180
    )

    assert [r.request_id for r in results] == [
        request_id("tw-group", "add-two", str(i)) for i in range(4)
    ]
    assert [r.reward for r in results] == [right.reward, wrong.reward, 0.0, right.reward]
    assert [r.reward for r in results] == [1.0, 0.5, 0.0, 1.0]
    assert [r.status for r in results] == [Status.SUCCEEDED] * 4
    assert [r.loss_mask for r in results] == [False] * 4
    assert [r.tests_passed for r in results] == [2, 1, 0, 2]
    no_code = results[2]
    assert (no_code.flags, no_code.feedback) == ([NO_CODE_FLAG], NO_CODE_FEEDBACK)
    assert no_code.tests_expected == 0 and no_code.trace_uri is None  # no sandbox ran
    assert all(NO_CODE_FLAG not in r.flags for r in results[:2] + results[3:])
    assert all(r.trace_uri for r in results[:2] + results[3:])
    twin = client.aio._twin
    assert twin is not None
    sfn = twin.client("stepfunctions")
    executions = sfn.list_executions(stateMachineArn=twin.output(c.OUTPUT_ROLLOUT_ARN))
    names = {e["name"] for e in executions["executions"]}  # each alone, or in a batch:
    for batch in sfn.list_executions(stateMachineArn=twin.output(c.OUTPUT_BATCH_ARN))["executions"]:
        started = sfn.describe_execution(executionArn=batch["executionArn"])["input"]
        names |= set(BatchInput.model_validate_json(started).request_ids)
    assert {r.request_id for r in results} & names == {
        results[0].request_id,
        results[1].request_id,
        results[3].request_id,
    }  # nothing ran for the completion without code


def test_cancelling_a_running_request_is_recorded_and_kept(client: Client) -> None:
    twin = client.aio._twin
    assert twin is not None
    sfn = twin.client("stepfunctions")
    rollout = twin.output(c.OUTPUT_ROLLOUT_ARN)
    slow = request("tw-cancel", CORRECT, commands=[["sleep", "8"]])
    (handle,) = client.submit([slow])
    execution = f"{rollout.replace(':stateMachine:', ':execution:', 1)}:tw-cancel"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = [e["name"] for e in sfn.list_executions(stateMachineArn=rollout)["executions"]]
        if "tw-cancel" in names:
            break
        time.sleep(0.2)
    assert sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
    time.sleep(2)  # on a worker, sleeping
    assert not handle.done()

    client.cancel([handle])
    result = handle.result(timeout=5)
    assert (result.status, result.reward, result.loss_mask) == (Status.CANCELLED, None, True)
    # StopExecution was called. (moto's Step Functions aborts an execution waiting on a task
    # token only when that wait ends, here when the worker reports the job done.)
    deadline = time.monotonic() + 60
    while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
        assert time.monotonic() < deadline, "the execution was not stopped"
        time.sleep(0.5)
    assert sfn.describe_execution(executionArn=execution)["status"] == "ABORTED"
    table = client.aio.resources.executions_table
    item = twin.client("dynamodb").get_item(
        TableName=table, Key={c.TABLE_KEY: {"S": "tw-cancel"}}, ConsistentRead=True
    )["Item"]
    assert item["status"]["S"] == "cancelled"  # the job's own end did not replace it

    (again,) = client.submit([slow])  # the table keeps it: nothing runs again
    assert again.done()
    assert again.result().status == Status.CANCELLED
