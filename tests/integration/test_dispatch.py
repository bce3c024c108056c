"""The dispatcher under moto: started, already started, already ended, rejected or
dead-lettered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox import keys
from trialbox.models import ExecutionRequest, Status, result_for
from trialbox.pipeline.dispatch import Dispatched, Dispatcher
from trialbox.pipeline.record import record

PASS_MACHINE = {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 60, "End": True}}}


@pytest.fixture
def dispatcher(aws: Aws) -> Dispatcher:
    arn = aws.state_machine("rollout", PASS_MACHINE)

    def dead_letter(body: str, reason: str) -> None:
        aws.sqs.send_message(
            QueueUrl=aws.dlq,
            MessageBody=body,
            MessageAttributes={"reason": {"DataType": "String", "StringValue": reason}},
        )

    requests = aws.sqs.create_queue(QueueName="requests")["QueueUrl"]

    def requeue(body: str) -> None:
        aws.sqs.send_message(QueueUrl=requests, MessageBody=body)

    return Dispatcher(aws.sfn, arn, aws.table, aws.traces, dead_letter, aws.admission, requeue)


def request(request_id: str = "r-1", **changes: Any) -> str:
    body = {"request_id": request_id, "task": ADD_TASK, "files": {"solution.py": CORRECT}}
    return json.dumps(body | changes)


def dead_letters(aws: Aws) -> list[tuple[str, str]]:
    return [
        (m["Body"], m["MessageAttributes"]["reason"]["StringValue"]) for m in aws.messages(aws.dlq)
    ]


def test_a_valid_request_starts_one_execution_named_after_it(
    aws: Aws, dispatcher: Dispatcher
) -> None:
    assert dispatcher(request()) == Dispatched.STARTED
    executions = aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]
    assert [e["name"] for e in executions] == ["r-1"]
    started = aws.sfn.describe_execution(executionArn=executions[0]["executionArn"])
    assert json.loads(started["input"])["request"]["task"]["task_id"] == "add-two"


def test_a_redelivered_message_runs_once(aws: Aws, dispatcher: Dispatcher) -> None:
    assert dispatcher(request()) == Dispatched.STARTED
    # Step Functions itself answers a same-name, same-input start with the running execution;
    # after it ended, the dispatcher compares the input.
    assert dispatcher(request()) in (Dispatched.STARTED, Dispatched.ALREADY_STARTED)
    executions = aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]
    assert len(executions) == 1
    assert dead_letters(aws) == []


def test_the_same_id_with_other_content_is_dead_lettered(aws: Aws, dispatcher: Dispatcher) -> None:
    assert dispatcher(request()) == Dispatched.STARTED
    other = request(files={"solution.py": "def add(a, b):\n    return 0\n"})
    assert dispatcher(other) == Dispatched.DEAD_LETTERED
    assert dead_letters(aws) == [(other, "request_id r-1 reused with different content")]
    executions = aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]
    assert len(executions) == 1


def test_an_invalid_request_gets_a_rejected_result_and_no_execution(
    aws: Aws, dispatcher: Dispatcher
) -> None:
    bad = request("r-bad", limits={"memory_mb": 0}, colour="red")
    assert dispatcher(bad) == Dispatched.REJECTED
    item = aws.item("r-bad")
    assert item is not None and item["status"] == {"S": "rejected"}
    assert item["loss_mask"] == {"BOOL": True} and "reward" not in item
    result = json.loads(item["result"]["S"])
    assert result["error"] == (
        "limits.memory_mb: Input should be greater than or equal to 32; "
        "colour: Extra inputs are not permitted"
    )
    assert aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"] == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "no recoverable request_id"),
        (json.dumps({"files": {}}), "no recoverable request_id"),
        (json.dumps({"request_id": "has spaces"}), "no recoverable request_id"),
    ],
)
def test_no_recoverable_request_id_goes_to_the_dlq(
    aws: Aws, dispatcher: Dispatcher, body: str, reason: str
) -> None:
    assert dispatcher(body) == Dispatched.DEAD_LETTERED
    assert dead_letters(aws) == [(body, reason)]


def pointer_to(aws: Aws, body: str) -> str:
    """Where the SDK puts a large request: under payloads/, keyed by its content hash."""
    sha = ExecutionRequest.model_validate_json(body).content_sha256()
    uri = aws.traces.put_json(keys.payload_key(sha), json.loads(body))
    return json.dumps({"request_id": json.loads(body)["request_id"], "payload_uri": uri})


def test_a_large_request_comes_by_pointer(aws: Aws, dispatcher: Dispatcher) -> None:
    pointer = pointer_to(aws, request("r-big"))
    assert dispatcher(pointer) == Dispatched.STARTED
    (execution,) = aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]
    started = aws.sfn.describe_execution(executionArn=execution["executionArn"])
    sha = ExecutionRequest.model_validate_json(request("r-big")).content_sha256()
    assert json.loads(started["input"]) == json.loads(pointer) | {"content_sha256": sha}


def test_the_same_id_with_other_large_content_is_dead_lettered(
    aws: Aws, dispatcher: Dispatcher
) -> None:
    """Each content has its own payload key, so new content is never taken for a redelivery
    (Prepare would have run it under the first request's execution)."""
    first = pointer_to(aws, request("r-big"))
    other = pointer_to(
        aws, request("r-big", files={"solution.py": "def add(a, b):\n    return 0\n"})
    )
    assert first != other
    assert dispatcher(first) == Dispatched.STARTED
    assert dispatcher(other) == Dispatched.DEAD_LETTERED
    assert dead_letters(aws) == [(other, "request_id r-big reused with different content")]
    assert dispatcher(first) in (Dispatched.STARTED, Dispatched.ALREADY_STARTED)
    assert len(aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]) == 1


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        (
            "s3://traces/payloads/nowhere.json",
            "payload_uri: the payload cannot be read (NoSuchKey for s3://traces/payloads/nowhere.json)",
        ),
        (
            "s3://tasksets/secret.jsonl",
            "payload_uri: the payload cannot be read "
            "('s3://tasksets/secret.jsonl' is not under s3://traces/payloads/)",
        ),
        (
            "s3://traces/jobs/other/job.json",
            "payload_uri: the payload cannot be read "
            "('s3://traces/jobs/other/job.json' is not under s3://traces/payloads/)",
        ),
    ],
)
def test_a_pointer_to_a_missing_or_foreign_object_is_rejected(
    aws: Aws, dispatcher: Dispatcher, uri: str, reason: str
) -> None:
    aws.tasksets.put_json("secret.jsonl", {"task_id": "x"})
    aws.traces.put_json("jobs/other/job.json", json.loads(request("other")))
    pointer = json.dumps({"request_id": "r-ptr", "payload_uri": uri})
    assert dispatcher(pointer) == Dispatched.REJECTED
    item = aws.item("r-ptr")
    assert item is not None and item["status"] == {"S": "rejected"}
    assert json.loads(item["result"]["S"])["error"] == reason
    assert aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"] == []


def test_a_request_that_already_ended_starts_nothing(aws: Aws, dispatcher: Dispatcher) -> None:
    """Its client cancelled it while the message waited in the queue: no sandbox runs it."""
    cancelled = result_for("r-gone", Status.CANCELLED, error="cancelled by the client")
    record(cancelled, aws.table, None)
    assert dispatcher(request("r-gone")) == Dispatched.ALREADY_ENDED
    assert aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"] == []
    assert json.loads(aws.item("r-gone")["result"]["S"])["status"] == "cancelled"
    assert aws.admission.in_flight() == 0  # the slot its dispatch took, given back


def test_an_ended_request_sent_again_with_other_content_is_dead_lettered(
    aws: Aws, dispatcher: Dispatcher
) -> None:
    first = ExecutionRequest.model_validate_json(request("r-done"))
    done = result_for("r-done", Status.SUCCEEDED, scored_reward=1.0)
    record(done, aws.table, None, content_sha256=first.content_sha256())
    other = request("r-done", files={"solution.py": "def add(a, b):\n    return 0\n"})
    assert dispatcher(other) == Dispatched.DEAD_LETTERED
    assert dead_letters(aws) == [(other, "request_id r-done reused with different content")]
    assert dispatcher(request("r-done")) == Dispatched.ALREADY_ENDED


def test_a_large_request_sent_inline_starts_with_a_pointer_not_its_body(
    aws: Aws, dispatcher: Dispatcher
) -> None:
    """SQS takes 1 MiB; Step Functions' state 256 KiB. A raw sender's 300 KB request inline
    would fail its execution outside every Catch (States.DataLimitExceeded): no result ever.
    The dispatcher stores it where the SDK stores large requests and starts with a pointer."""
    big = request("r-big", files={"solution.py": CORRECT + "# " + "x" * 300_000 + "\n"})
    assert dispatcher(big) == Dispatched.STARTED
    (execution,) = aws.sfn.list_executions(stateMachineArn=dispatcher.rollout_arn)["executions"]
    started = aws.sfn.describe_execution(executionArn=execution["executionArn"])
    assert len(started["input"]) < 1000
    pointer = json.loads(started["input"])["payload_uri"]
    assert pointer.startswith("s3://traces/" + keys.PAYLOADS_PREFIX)
    assert json.loads(aws.traces.get_bytes(pointer)) == json.loads(big)
