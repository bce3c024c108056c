"""The twin refuses what AWS refuses, at AWS's boundary, and accepts what AWS accepts: one test
per limit in docs/twin-fidelity.md. Where moto 5.2.5 differs from AWS, the test first shows the
gap (so it fails if the patch stops being needed), then the patched behaviour."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.exceptions import AWSError

from trialbox.local import limit_patches, limits, patches
from trialbox.local.function_urls import FunctionUrl
from trialbox.local.functions import FunctionHost
from trialbox.local.poller import Poller
from trialbox.local.resources import REGION, EventSourceMapping, FunctionSpec, create
from trialbox.local.template import load_template

ROLE = "arn:aws:iam::123456789012:role/r"
MOTO_CONFIG: Any = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": False},
}
KIB256 = limits.SFN_PAYLOAD_BYTES


@pytest.fixture
def aws() -> Iterator[dict[str, Any]]:
    """In-process moto as the twin's services run it, without the limit patches."""
    # moto logs a failed state whole: a 256 KiB payload each time.
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    with mock_aws(config=MOTO_CONFIG):
        services = ("sqs", "stepfunctions", "dynamodb", "s3", "ecs")
        yield {s: boto3.client(s, REGION) for s in services}
    limit_patches.undo()


def code(error: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return error.value.response["Error"]["Code"], error.value.response["Error"]["Message"]


def machine(sfn: Any, name: str, states: dict[str, Any], start: str) -> str:
    definition = json.dumps({"StartAt": start, "States": states})
    return str(
        sfn.create_state_machine(name=name, definition=definition, roleArn=ROLE)["stateMachineArn"]
    )


def ended(sfn: Any, execution: str, within_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while (described := sfn.describe_execution(executionArn=execution))["status"] == "RUNNING":
        assert time.monotonic() < deadline, f"{execution} still running"
        time.sleep(0.05)
    return dict(described)


def failure(sfn: Any, execution: str) -> tuple[str, str] | None:
    described = ended(sfn, execution)
    if described["status"] == "SUCCEEDED":
        return None
    return described.get("error", ""), described.get("cause", "")


# --- Step Functions --------------------------------------------------------------------------


def waiting_task(queue: str, **timing: Any) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "Parameters": {"QueueUrl": queue, "MessageBody": {"token.$": "$$.Task.Token"}},
        "End": True,
        **timing,
    }


def test_a_task_ends_at_its_heartbeat_and_timeout_seconds_from_literals_and_paths(
    aws: dict[str, Any],
) -> None:
    """A lapsed heartbeat ends the task with States.HeartbeatTimeout, a lapsed timeout with
    States.Timeout, within a second of the bound, from `*Seconds` and `*SecondsPath`. moto
    enforces the times already (this keeps it so) but names both States.Timeout."""
    sfn, queue = aws["stepfunctions"], aws["sqs"].create_queue(QueueName="w")["QueueUrl"]
    both = {"HeartbeatSecondsPath": "$.hb", "TimeoutSecondsPath": "$.to"}
    cases: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
        # name: (timing, input, the error AWS reports)
        "heartbeat": ({"HeartbeatSeconds": 1, "TimeoutSeconds": 30}, {}, "States.HeartbeatTimeout"),
        "timeout": ({"TimeoutSeconds": 1}, {}, "States.Timeout"),
        "heartbeat-path": (both, {"hb": 1, "to": 30}, "States.HeartbeatTimeout"),
        "timeout-path": (both, {"hb": 20, "to": 1}, "States.Timeout"),
    }
    arns = {
        name: machine(sfn, name, {"Execute": waiting_task(queue, **timing)}, "Execute")
        for name, (timing, _, _) in cases.items()
    }

    def run(run_name: str) -> dict[str, tuple[str, float]]:
        started = {}
        for name, (_, given, _) in cases.items():
            execution = sfn.start_execution(
                stateMachineArn=arns[name], name=run_name, input=json.dumps(given)
            )
            started[name] = (execution["executionArn"], time.monotonic())
        ended_as = {}
        for name, (execution, at) in started.items():
            error = (failure(sfn, execution) or ("",))[0]
            ended_as[name] = (error, time.monotonic() - at)
        return ended_as

    gap = run("gap")
    assert {name: error for name, (error, _) in gap.items()} == dict.fromkeys(
        cases, "States.Timeout"
    )
    limit_patches.enforce()
    for name, (error, took) in run("patched").items():
        assert error == cases[name][2] and 0.9 < took < 3, (name, error, took)


def test_a_state_output_over_256_kib_fails_the_execution(aws: dict[str, Any]) -> None:
    """States.DataLimitExceeded for a state output over 262,144 bytes of JSON; exactly 262,144
    bytes passes."""
    sfn = aws["stepfunctions"]

    def run(output_bytes: int) -> tuple[str, str] | None:
        # A Parallel state's output is `[{"x":"aaa"}]`: 10 bytes around the string.
        result = {"x": "a" * (output_bytes - 10)}
        branch = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Result": result, "End": True}}}
        states = {"Fan": {"Type": "Parallel", "Branches": [branch], "End": True}}
        arn = machine(sfn, f"m{output_bytes}-{time.monotonic_ns()}", states, "Fan")
        return failure(sfn, sfn.start_execution(stateMachineArn=arn)["executionArn"])

    # moto refuses exactly 262,144: it counts `json.dumps` with spaces, and refuses at the bound.
    assert run(KIB256) is not None
    limit_patches.enforce()
    assert run(KIB256) is None
    error, cause = run(KIB256 + 1) or ("", "")
    assert error == "States.DataLimitExceeded"
    assert cause == (
        "The state/task 'Fan' returned a result with a size exceeding the maximum number of "
        "bytes service limit."
    )


def test_catch_all_does_not_catch_an_oversized_task_result(
    aws: dict[str, Any], host: FunctionHost
) -> None:
    """States.ALL does not match States.DataLimitExceeded: a Lambda task whose result is over
    the quota fails the execution past its Catch (the Rollout's Catch into Record included)."""
    sfn = aws["stepfunctions"]
    states = {
        "Big": {
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": "Sized", "Payload": {"answer": KIB256}},
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Caught"}],
            "End": True,
        },
        "Caught": {"Type": "Pass", "Result": "caught", "End": True},
    }
    patches.route_lambda_invocations(host.invoke)
    try:
        arn = machine(sfn, "big", states, "Big")
        execution = sfn.start_execution(stateMachineArn=arn, name="gap")["executionArn"]
        assert failure(sfn, execution) is None  # moto's States.ALL caught it
        assert "caught" in sfn.describe_execution(executionArn=execution)["output"]
        limit_patches.enforce()
        execution = sfn.start_execution(stateMachineArn=arn, name="patched")["executionArn"]
        assert (failure(sfn, execution) or ("",))[0] == "States.DataLimitExceeded"
    finally:
        patches.undo()


def test_an_execution_input_over_256_kib_is_refused(aws: dict[str, Any]) -> None:
    sfn = aws["stepfunctions"]
    arn = machine(sfn, "m", {"P": {"Type": "Pass", "End": True}}, "P")
    # A JSON string of n characters is n + 2 bytes.
    sfn.start_execution(stateMachineArn=arn, name="gap", input=json.dumps("a" * (KIB256 - 1)))
    limit_patches.enforce()
    execution = sfn.start_execution(
        stateMachineArn=arn, name="at", input=json.dumps("a" * (KIB256 - 2))
    )
    assert failure(sfn, execution["executionArn"]) is None
    with pytest.raises(ClientError) as refused:
        sfn.start_execution(stateMachineArn=arn, name="over", input=json.dumps("a" * (KIB256 - 1)))
    assert code(refused) == (
        "ValidationException",
        "1 validation error detected: Value at 'input' failed to satisfy constraint: Member "
        "must have length less than or equal to 262144",
    )


def token(sqs: Any, queue: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1).get("Messages", []):
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            return str(json.loads(message["Body"])["token"])
    raise AssertionError("no task token sent")


def test_a_send_task_success_output_over_256_kib_is_refused(aws: dict[str, Any]) -> None:
    sfn, sqs = aws["stepfunctions"], aws["sqs"]
    queue = sqs.create_queue(QueueName="w")["QueueUrl"]
    execute = waiting_task(queue, HeartbeatSeconds=20, TimeoutSeconds=30)
    arn = machine(sfn, "m", {"Execute": execute}, "Execute")
    over = json.dumps("a" * (KIB256 - 1))
    first = sfn.start_execution(stateMachineArn=arn, name="gap")["executionArn"]
    sfn.send_task_success(taskToken=token(sqs, queue), output=over)  # moto takes it
    assert failure(sfn, first) is None
    limit_patches.enforce()
    second = sfn.start_execution(stateMachineArn=arn, name="patched")["executionArn"]
    task = token(sqs, queue)
    with pytest.raises(ClientError) as refused:
        sfn.send_task_success(taskToken=task, output=over)
    assert code(refused) == (
        "ValidationException",
        "1 validation error detected: Value at 'output' failed to satisfy constraint: Member "
        "must have length less than or equal to 262144",
    )
    sfn.send_task_success(taskToken=task, output=json.dumps("a" * (KIB256 - 2)))
    assert failure(sfn, second) is None


def _stop(sfn: Any, arn: str) -> None:
    """StopExecution, once moto's execution thread has made the execution's environment (a
    stop before it fails inside moto on a loaded machine)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sfn.stop_execution(executionArn=arn)
            return
        except (ClientError, AttributeError):  # moto's own error, raised in process
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_execution_names_are_checked_and_never_reused(aws: dict[str, Any]) -> None:
    """1-80 characters without AWS's forbidden ones; a name is reused only idempotently: same
    input while the execution runs returns it (the dispatcher's redelivery), anything else is
    ExecutionAlreadyExists (a reused request_id), also once it has ended."""
    sfn, sqs = aws["stepfunctions"], aws["sqs"]
    queue = sqs.create_queue(QueueName="w")["QueueUrl"]
    arn = machine(sfn, "m", {"Execute": waiting_task(queue, TimeoutSeconds=30)}, "Execute")
    for name in ("a" * 81, "a b", "a/b", "a:b", "a*b"):  # moto starts them all
        started = sfn.start_execution(stateMachineArn=arn, name=name)
        _stop(sfn, started["executionArn"])
    limit_patches.enforce()
    with pytest.raises(ClientError) as refused:
        sfn.start_execution(stateMachineArn=arn, name="b" * 81)
    assert code(refused) == (
        "ValidationException",
        f"1 validation error detected: Value '{'b' * 81}' at 'name' failed to satisfy "
        "constraint: Member must have length less than or equal to 80",
    )
    for name in ("b b", "b/b", "b:b", "b*b", "b\x01b", "b{b}"):
        with pytest.raises(ClientError) as refused:
            sfn.start_execution(stateMachineArn=arn, name=name)
        assert code(refused) == ("InvalidName", f"Invalid Name: '{name}'")
    name = "r" * 80  # the most AWS takes, with the characters a request_id has
    queue = sqs.create_queue(QueueName="reuse")["QueueUrl"]  # only this execution's token
    arn = machine(sfn, "reuse", {"Execute": waiting_task(queue, TimeoutSeconds=30)}, "Execute")
    first = sfn.start_execution(stateMachineArn=arn, name=name, input='{"n": 1}')
    again = sfn.start_execution(stateMachineArn=arn, name=name, input='{"n": 1}')
    assert again["executionArn"] == first["executionArn"]
    with pytest.raises(ClientError) as refused:
        sfn.start_execution(stateMachineArn=arn, name=name, input='{"n": 2}')
    assert code(refused)[0] == "ExecutionAlreadyExists"
    sfn.send_task_success(taskToken=token(sqs, queue), output="{}")
    assert failure(sfn, first["executionArn"]) is None
    with pytest.raises(ClientError) as refused:
        sfn.start_execution(stateMachineArn=arn, name=name, input='{"n": 1}')
    assert code(refused)[0] == "ExecutionAlreadyExists"


def test_an_execution_fails_when_its_history_is_full(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 25,000 events on AWS; checked here at 600 (moto takes ~2 ms an event: 25,000 would
    cost the suite a minute). The bound is limits.SFN_HISTORY_EVENTS, read at each event."""
    sfn = aws["stepfunctions"]
    limit_patches.enforce()
    monkeypatch.setattr(limits, "SFN_HISTORY_EVENTS", 600)
    spin = {  # each turn: a Pass's 2 events and a Choice's 2; it would stop at 4,000 events
        "Turn": {"Type": "Pass", "Parameters": {"n.$": "States.MathAdd($.n, 1)"}, "Next": "More"},
        "More": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.n", "NumericLessThan": 1000, "Next": "Turn"}],
            "Default": "Done",
        },
        "Done": {"Type": "Succeed"},
    }
    arn = machine(sfn, "spin", spin, "Turn")
    execution = sfn.start_execution(stateMachineArn=arn, input='{"n": 0}')["executionArn"]
    described = ended(sfn, execution)
    assert (described["status"], described.get("error")) == ("FAILED", "States.Runtime")
    assert "The execution reached the maximum number of history events (600)." in described.get(
        "cause", ""
    )
    history = sfn.get_paginator("get_execution_history").paginate(executionArn=execution)
    events = [e for page in history for e in page["events"]]
    assert len(events) == 600 + 1  # and the ExecutionFailed event
    monkeypatch.undo()
    assert limits.SFN_HISTORY_EVENTS == 25_000


# --- Lambda ----------------------------------------------------------------------------------

HANDLER = """
import base64

def handler(event, context):
    if "rawPath" in event:  # a function URL's: answer a body of the size asked
        body = event["body"]
        if event["isBase64Encoded"]:
            body = base64.b64decode(body)
        return {"statusCode": 200, "body": "a" * int(body)}
    if "answer" in event:
        return "a" * event["answer"]
    return len(event["data"])
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FunctionHost]:
    directory = tmp_path_factory.mktemp("sized")
    (directory / "sized_handler.py").write_text(HANDLER)
    sys.path.insert(0, str(directory))  # the function processes import it from there
    spec = FunctionSpec("Sized", "sized_handler.handler", {}, timeout_s=30)
    functions = FunctionHost({"Sized": spec}, {}, directory / "logs", copies=1)
    functions.start()
    yield functions
    sys.path.remove(str(directory))
    functions.stop()


def request_of(size: int) -> bytes:
    body = b'{"data": ""}'
    return b'{"data": "' + b"a" * (size - len(body)) + b'"}'


def test_a_synchronous_invoke_takes_6_mb_each_way(host: FunctionHost) -> None:
    most_in, most_out = limits.LAMBDA_REQUEST_BYTES, limits.LAMBDA_RESPONSE_BYTES
    assert host.invoke("Sized", request_of(most_in)) == (True, str(most_in - 12).encode())
    with pytest.raises(limits.Refused) as refused:
        host.invoke("Sized", request_of(most_in + 1))
    assert (refused.value.code, refused.value.status) == ("RequestTooLargeException", 413)
    assert str(refused.value) == (
        "Request must be smaller than 6291456 bytes for the InvokeFunction operation"
    )
    ok, answer = host.invoke("Sized", json.dumps({"answer": most_out - 2}).encode())
    assert ok and len(answer) == most_out  # a JSON string: its quotes count
    ok, answer = host.invoke("Sized", json.dumps({"answer": most_out - 1}).encode())
    assert not ok
    assert json.loads(answer) == {
        "errorType": "Function.ResponseSizeTooLarge",
        "errorMessage": (
            "Response payload size exceeded maximum allowed payload size (6291556 bytes)."
        ),
    }


def test_the_invoke_api_answers_an_oversized_request_with_413(host: FunctionHost) -> None:
    patches.route_lambda_invocations(host.invoke)
    limit_patches.enforce()
    try:
        backend = LambdaSimpleBackend(REGION, "123456789012")
        assert backend.invoke("Sized", None, request_of(100), {}, {}) == b"88"
        with pytest.raises(AWSError) as refused:
            backend.invoke("Sized", None, request_of(limits.LAMBDA_REQUEST_BYTES + 1), {}, {})
        assert (refused.value.code, refused.value.error_type) == (413, "RequestTooLargeException")
    finally:
        limit_patches.undo()
        patches.undo()


def test_a_function_url_refuses_over_6_mb_each_way(host: FunctionHost) -> None:
    url = FunctionUrl("Sized")
    url.invoke = host.invoke
    most = limits.LAMBDA_RESPONSE_BYTES - len(json.dumps({"statusCode": 200, "body": ""}))
    status, _, body = url.answer("POST", "/", {}, str(most).encode())
    assert (status, len(body)) == (200, most)
    status, _, body = url.answer("POST", "/", {}, str(most + 1).encode())
    assert (status, json.loads(body)) == (502, {"Message": "Internal Server Error"})
    status, _, body = url.answer("POST", "/", {}, b"1" * limits.LAMBDA_REQUEST_BYTES)
    assert (status, json.loads(body)) == (
        413,
        {"Message": "Request must be smaller than 6291456 bytes for the InvokeFunction operation"},
    )


# --- SQS -------------------------------------------------------------------------------------


def template(resources: dict[str, Any]) -> dict[str, Any]:
    return {"Resources": resources, "Outputs": {}}


QUEUE = "AWS::SQS::Queue"


def test_each_queue_takes_its_maximum_message_size_from_the_template(aws: dict[str, Any]) -> None:
    sqs = aws["sqs"]
    small = {"Small": {"Type": QUEUE, "Properties": {"MaximumMessageSize": 1024}}}
    create(template(small), aws)
    url = sqs.get_queue_url(QueueName="Small")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a" * 1024)
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="a" * 1025)
    assert code(refused) == (
        "InvalidParameterValue",
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )
    with pytest.raises(ClientError) as refused:  # each entry of a batch, too
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a" * 1025}])
    assert code(refused)[0] == "InvalidParameterValue"


def test_the_stacks_queues_have_sqs_default_maximum_message_size(aws: dict[str, Any]) -> None:
    """The template sets none: SQS's default, 1 MiB, as on AWS (the SDK's sessions count on
    it: trialbox.sdk.sessions.MAX_MESSAGE_BYTES)."""
    create(load_template(), aws)
    urls = aws["sqs"].list_queues()["QueueUrls"]
    sizes = {
        aws["sqs"].get_queue_attributes(QueueUrl=u, AttributeNames=["MaximumMessageSize"])[
            "Attributes"
        ]["MaximumMessageSize"]
        for u in urls
    }
    assert len(urls) >= 4 and sizes == {"1048576"}


def test_send_message_batch_takes_10_entries_and_1_mib_in_all(aws: dict[str, Any]) -> None:
    """Already enforced by moto: this keeps it so."""
    sqs = aws["sqs"]
    url = sqs.create_queue(QueueName="q")["QueueUrl"]

    def batch(*sizes: int) -> dict[str, Any]:
        entries = [{"Id": str(i), "MessageBody": "a" * n} for i, n in enumerate(sizes)]
        return dict(sqs.send_message_batch(QueueUrl=url, Entries=entries))

    assert len(batch(*[1] * 10)["Successful"]) == 10
    with pytest.raises(ClientError) as refused:
        batch(*[1] * 11)
    assert code(refused) == (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "Maximum number of entries per request are 10. You have sent 11.",
    )
    half = 2**19
    assert len(batch(half, half)["Successful"]) == 2
    with pytest.raises(ClientError) as refused:
        batch(half, half + 1)
    assert code(refused) == (
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes.",
    )


def mapped(visibility_s: int | None, timeout_s: int) -> dict[str, Any]:
    queue_props = {} if visibility_s is None else {"VisibilityTimeout": visibility_s}
    queue = f"Work{visibility_s}"  # a queue per call: SQS keeps a name's first attributes
    return template(
        {
            queue: {"Type": QUEUE, "Properties": queue_props},
            "Consumer": {
                "Type": "AWS::Lambda::Function",
                "Properties": {
                    "Handler": "functions.consumer.handler.handler",
                    "Timeout": timeout_s,
                },
            },
            "Mapping": {
                "Type": "AWS::Lambda::EventSourceMapping",
                "Properties": {
                    "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
                    "FunctionName": {"Ref": "Consumer"},
                },
            },
        }
    )


def test_an_event_source_batch_stays_within_lambdas_6_mb(aws: dict[str, Any]) -> None:
    """Lambda passes as many records as fit its synchronous payload; the rest come next."""
    sqs = aws["sqs"]
    url = sqs.create_queue(QueueName="big", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    for i in range(10):  # 10 MB in all, each message within SQS's 1 MiB
        sqs.send_message(QueueUrl=url, MessageBody=f"{i}" + "a" * 999_999)
    events: list[bytes] = []

    def invoke(name: str, payload: bytes) -> tuple[bool, bytes]:
        events.append(payload)
        return True, b"{}"

    poller = Poller(sqs, EventSourceMapping(url, "Consumer", 10, True), invoke)
    while sum(len(json.loads(e)["Records"]) for e in events) < 10:
        poller.poll_once()
        assert len(events) <= 3
    assert max(len(e) for e in events) <= limits.LAMBDA_REQUEST_BYTES
    assert len(json.loads(events[0])["Records"]) == 6  # 6 records of 1 MB and their envelopes
    bodies = sorted(r["body"][0] for e in events for r in json.loads(e)["Records"])
    assert bodies == [str(i) for i in range(10)]  # each once


def test_a_mappings_invocations_run_at_once_up_to_its_maximum_concurrency(
    aws: dict[str, Any], tmp_path: Any
) -> None:
    """Lambda runs a mapping's invocations at once, up to its ScalingConfig's
    MaximumConcurrency; the twin as many as the function has processes within that (its
    pollers share the queue, each message delivered to one). One poller at a time held every
    dispatcher's admission behind one's retry backoffs."""
    scaled = mapped(62, 60)
    scaled["Resources"]["Mapping"]["Properties"]["ScalingConfig"] = {"MaximumConcurrency": 3}
    assert [m.max_concurrency for m in create(scaled, aws).mappings] == [3]
    assert [m.max_concurrency for m in create(mapped(63, 60), aws).mappings] == [None]
    host = FunctionHost({"Consumer": FunctionSpec("Consumer", "h", {}, 60.0)}, {}, tmp_path)
    assert [host.concurrency("Consumer", bound) for bound in (3, 1, None)] == [2, 1, 2]

    sqs = aws["sqs"]
    url = sqs.create_queue(QueueName="shared", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    for i in range(4):
        sqs.send_message(QueueUrl=url, MessageBody=str(i))
    running, most, bodies = [0], [0], []
    lock = threading.Lock()

    def invoke(name: str, payload: bytes) -> tuple[bool, bytes]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            bodies.extend(r["body"] for r in json.loads(payload)["Records"])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return True, b"{}"

    pollers = [Poller(sqs, EventSourceMapping(url, "Consumer", 1, True), invoke) for _ in range(2)]
    threads = [
        threading.Thread(target=lambda p=p: [p.poll_once() for _ in range(3)]) for p in pollers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert most[0] == 2 and sorted(bodies) == ["0", "1", "2", "3"]


def test_a_mapping_whose_queue_hides_messages_shorter_than_the_function_runs_is_refused(
    aws: dict[str, Any],
) -> None:
    assert len(create(mapped(60, 60), aws).mappings) == 1  # equal: Lambda takes it
    with pytest.raises(limits.TemplateRefused) as refused:
        create(mapped(59, 60), aws)
    assert str(refused.value) == (
        'Mapping: Resource handler returned message: "Invalid request provided: Queue '
        'visibility timeout: 59 seconds is less than Function timeout: 60 seconds" '
        "(function Consumer)"
    )
    with pytest.raises(limits.TemplateRefused, match="visibility timeout: 30 seconds"):
        create(mapped(None, 31), aws)  # SQS's default visibility timeout


# --- DynamoDB --------------------------------------------------------------------------------


def test_an_item_takes_400_kb_with_its_attribute_names(aws: dict[str, Any]) -> None:
    ddb = aws["dynamodb"]
    ddb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    def item(total: int) -> dict[str, Any]:  # "k" + "a" + "v" + the value
        return {"k": {"S": "a"}, "v": {"S": "x" * (total - 3)}}

    most = limits.DYNAMODB_ITEM_BYTES
    with pytest.raises(ClientError):  # moto refuses over 405,000 bytes: below AWS's bound
        ddb.put_item(TableName="t", Item=item(most))
    limit_patches.enforce()
    ddb.put_item(TableName="t", Item=item(most))
    with pytest.raises(ClientError) as refused:
        ddb.put_item(TableName="t", Item=item(most + 1))
    assert code(refused) == (
        "ValidationException",
        "Item size has exceeded the maximum allowed size",
    )
    ddb.put_item(TableName="t", Item=item(most - 10))
    with pytest.raises(ClientError) as refused:  # growing an item past it
        ddb.update_item(
            TableName="t",
            Key={"k": {"S": "a"}},
            UpdateExpression="SET w = :w",
            ExpressionAttributeValues={":w": {"S": "x" * 10}},
        )
    assert code(refused) == (
        "ValidationException",
        "Item size to update has exceeded the maximum allowed size",
    )


def test_batch_get_item_takes_100_keys_and_answers_16_mib_at_most(aws: dict[str, Any]) -> None:
    """Already enforced by moto: this keeps it so."""
    ddb = aws["dynamodb"]
    ddb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    keys = [{"k": {"S": f"{i:03}"}} for i in range(101)]
    with pytest.raises(ClientError) as refused:
        ddb.batch_get_item(RequestItems={"t": {"Keys": keys}})
    assert code(refused)[0] == "ValidationException"
    assert ddb.batch_get_item(RequestItems={"t": {"Keys": keys[:100]}})["Responses"]["t"] == []
    size = 390_000  # 44 of them are over 16 MiB
    for key in keys[:50]:
        ddb.put_item(TableName="t", Item=key | {"v": {"S": "x" * (size - 5)}})
    pending, got = keys[:50], 0
    answers = 0
    while pending:
        answer = ddb.batch_get_item(RequestItems={"t": {"Keys": pending}})
        returned = answer["Responses"]["t"]
        assert len(returned) * size <= 16 * 2**20
        got += len(returned)
        answers += 1
        pending = answer.get("UnprocessedKeys", {}).get("t", {}).get("Keys", [])
    assert (got, answers) == (50, 2)
