"""The SDK's setup and its AWS calls against moto in-process: stack outputs, settings, the
stack version check, reading objects, and sending requests within SendMessageBatch's caps."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.support.moto import Aws
from trialbox import __version__, keys
from trialbox import constants as c
from trialbox.errors import (
    AwsCallError,
    InputError,
    StackVersionMismatch,
    TrialboxError,
    UnversionedStackWarning,
)
from trialbox.models import ExecutionRequest
from trialbox.sdk import AsyncClient, Client, Resources
from trialbox.sqs_batch import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES

ROLLOUT_ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:Rollout"
OUTPUTS = {
    c.OUTPUT_REQUESTS_QUEUE_URL: "https://sqs.us-east-1.amazonaws.com/123456789012/requests",
    c.OUTPUT_EXECUTIONS_TABLE: "executions",
    c.OUTPUT_TRACES_BUCKET: "traces",
    c.OUTPUT_TASKSETS_BUCKET: "tasksets",
    c.OUTPUT_ROLLOUT_ARN: ROLLOUT_ARN,
    c.OUTPUT_STACK_VERSION: __version__,
}
SERIES = ".".join(__version__.split(".")[:2])
ENVIRONMENT = {
    c.ENV_REQUESTS_QUEUE_URL: OUTPUTS[c.OUTPUT_REQUESTS_QUEUE_URL],
    c.ENV_EXECUTIONS_TABLE: "executions",
    c.ENV_TRACES_BUCKET: "traces",
    c.ENV_TASKSETS_BUCKET: "tasksets",
}


def deploy(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def requests_queue(aws: Aws) -> str:
    return str(aws.sqs.create_queue(QueueName="requests")["QueueUrl"])


@pytest.fixture
def client(aws: Aws, requests_queue: str) -> Iterator[Client]:
    resources = Resources.from_outputs(OUTPUTS | {c.OUTPUT_REQUESTS_QUEUE_URL: requests_queue})
    with Client(resources) as made:
        yield made


# --- where the stack is -------------------------------------------------------------------------


def test_from_stack_reads_the_outputs(aws: Aws) -> None:
    deploy("Trialbox", OUTPUTS)
    with Client.from_stack("Trialbox", region="us-east-1") as client:
        assert client.aio.resources == Resources.from_outputs(OUTPUTS)
        assert client.aio.resources.rollout_arn == ROLLOUT_ARN
        assert client.aio.resources.requests_queue_url == OUTPUTS[c.OUTPUT_REQUESTS_QUEUE_URL]
        assert (client.capacity, client.concurrency, client.is_local) == (None, 32, False)
    inner = AsyncClient.from_stack("Trialbox")
    assert inner.resources == Resources.from_outputs(OUTPUTS)


def test_trialbox_stack_names_the_stack_for_a_client_made_from_the_environment(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy("Named", OUTPUTS | {c.OUTPUT_RESULT_TTL_DAYS: "7"})
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(c.ENV_STACK, "Named")
    with Client() as client:
        assert client.aio.resources.rollout_arn == ROLLOUT_ARN
        assert client.aio.resources.result_ttl_days == 7
    assert Resources.from_outputs(OUTPUTS).result_ttl_days == 30  # an older stack's: the default


def test_the_stack_pool_size_sets_the_default_concurrency(aws: Aws) -> None:
    deploy("Sized", OUTPUTS | {c.OUTPUT_POOL_CAPACITY: "10"})
    with Client.from_stack("Sized") as client:
        assert (client.capacity, client.concurrency, client.is_local) == (10, 40, False)
    with Client.from_stack("Sized", concurrency=3) as client:
        assert (client.capacity, client.concurrency) == (10, 3)


@pytest.mark.parametrize("capacity", ["lots", "0", "-2"])
def test_a_bad_stack_pool_size_is_named(aws: Aws, capacity: str) -> None:
    deploy("Bad", OUTPUTS | {c.OUTPUT_POOL_CAPACITY: capacity})
    with pytest.raises(
        TrialboxError, match=f"stack output PoolMaxWorkers is not a count: '{capacity}'"
    ):
        Client.from_stack("Bad")


def test_pool_capacity_from_the_environment_and_a_bad_one_named(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    with Client() as client:
        assert (client.capacity, client.concurrency) == (None, 32)
        assert client.aio.resources.rollout_arn is None
    monkeypatch.setenv(c.ENV_POOL_CAPACITY, "3")
    monkeypatch.setenv(c.ENV_ROLLOUT_ARN, ROLLOUT_ARN)
    with Client() as client:
        assert (client.capacity, client.concurrency) == (3, 12)
        assert client.aio.resources.rollout_arn == ROLLOUT_ARN
    monkeypatch.setenv(c.ENV_POOL_CAPACITY, "lots")
    with pytest.raises(TrialboxError, match="TRIALBOX_POOL_CAPACITY: Input should be a valid int"):
        Client()
    monkeypatch.setenv(c.ENV_POOL_CAPACITY, "0")
    with pytest.raises(TrialboxError, match="TRIALBOX_POOL_CAPACITY: Input should be greater"):
        AsyncClient()


def test_missing_resource_names_are_listed(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*ENVIRONMENT, c.ENV_POOL_CAPACITY]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(c.ENV_EXECUTIONS_TABLE, "executions")
    with pytest.raises(TrialboxError) as raised:
        Client()
    assert str(raised.value) == (
        "no Trialbox resources given: set TRIALBOX_REQUESTS_QUEUE_URL, TRIALBOX_TRACES_BUCKET, "
        "TRIALBOX_TASKSETS_BUCKET, or TRIALBOX_STACK=NAME, use Client.from_stack(NAME), or "
        "Client.local()"
    )


def test_concurrency_below_one_is_refused(aws: Aws) -> None:
    with pytest.raises(InputError, match=r"^concurrency: Input should be greater than or equal"):
        Client(Resources.from_outputs(OUTPUTS), concurrency=0)


# --- the stack's version ------------------------------------------------------------------------


def test_from_stack_refuses_a_stack_of_another_major_minor(aws: Aws) -> None:
    deploy("Newer", OUTPUTS | {c.OUTPUT_STACK_VERSION: "9.9.0"})
    with pytest.raises(StackVersionMismatch) as raised:
        Client.from_stack("Newer")
    assert str(raised.value) == (
        f"stack 'Newer' was deployed by trialbox 9.9.0, but this SDK is {__version__}: "
        "major.minor must match. Install the stack's version (pip install 'trialbox==9.9.*'), "
        f"or deploy this version's stack (npx aws-cdk deploy from a trialbox {SERIES} checkout)."
    )
    assert (raised.value.stack_version, raised.value.sdk_version) == ("9.9.0", __version__)
    assert isinstance(raised.value, TrialboxError)
    with pytest.raises(StackVersionMismatch):
        AsyncClient.from_stack("Newer")


def test_from_stack_accepts_another_patch_release_silently(aws: Aws) -> None:
    deploy("Patched", OUTPUTS | {c.OUTPUT_STACK_VERSION: f"{SERIES}.99"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Client.from_stack("Patched") as client:
            assert client.aio.resources == Resources.from_outputs(OUTPUTS)


UNVERSIONED_MESSAGE = (
    "stack 'Older' has no TrialboxVersion output (deployed by a trialbox older than this "
    f"check), so it cannot be checked against this SDK ({__version__}); redeploy it from "
    "this version to be sure they match"
)


def unversioned() -> dict[str, str]:
    outputs = {k: v for k, v in OUTPUTS.items() if k != c.OUTPUT_STACK_VERSION}
    deploy("Older", outputs)
    return outputs


def test_async_from_stack_warns_about_a_stack_without_a_version(aws: Aws) -> None:
    outputs = unversioned()
    with pytest.warns(UnversionedStackWarning) as caught:
        client = AsyncClient.from_stack("Older")
    assert client.resources == Resources.from_outputs(outputs)
    assert [str(w.message) for w in caught] == [UNVERSIONED_MESSAGE]
    assert caught[0].filename == __file__  # points at the caller's line, not the SDK's


def test_from_stack_warns_about_a_stack_without_a_version(aws: Aws) -> None:
    outputs = unversioned()
    with pytest.warns(UnversionedStackWarning) as caught:
        client = Client.from_stack("Older")
    with client:
        assert client.aio.resources == Resources.from_outputs(outputs)
    assert [str(w.message) for w in caught] == [UNVERSIONED_MESSAGE]
    assert caught[0].filename == __file__  # points at the caller's line, not the SDK's


def test_from_stack_names_a_missing_stack(aws: Aws) -> None:
    with pytest.raises(AwsCallError, match=r"read stack 'Nope' in us-east-1: .*does not exist"):
        Client.from_stack("Nope")


def test_from_stack_names_the_outputs_a_foreign_stack_lacks(aws: Aws) -> None:
    deploy("Other", {c.OUTPUT_EXECUTIONS_TABLE: "executions"})
    with pytest.raises(TrialboxError, match="lack RequestsQueueUrl, TracesBucketName, Tasksets"):
        Client.from_stack("Other")


def test_no_region_is_an_actionable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(TrialboxError, match="set AWS_REGION"):
        Client.from_stack("Trialbox")


# --- reading objects ----------------------------------------------------------------------------


def test_read_object_returns_a_trace_and_rejects_other_uris(aws: Aws, client: Client) -> None:
    aws.s3.put_object(Bucket="traces", Key="traces/r1.json", Body=b'{"ok": 1}')
    assert client.read_object("s3://traces/traces/r1.json") == b'{"ok": 1}'
    for uri in ("/tmp/r1.json", "s3://traces", "s3://traces/", "https://traces/r1.json"):
        with pytest.raises(TrialboxError, match="not an s3://bucket/key URI"):
            client.read_object(uri)
    with pytest.raises(AwsCallError, match="get_object"):
        client.read_object("s3://traces/traces/missing.json")


# --- sending ------------------------------------------------------------------------------------


def queued_bodies(aws: Aws, queue_url: str, count: int, wait_s: float = 10) -> list[dict[str, Any]]:
    """The bodies of the messages on the queue (deleted as read), once `count` are there."""
    bodies: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait_s
    while len(bodies) < count and time.monotonic() < deadline:
        batch = aws.messages(queue_url)
        bodies += [json.loads(m["Body"]) for m in batch]
        for m in batch:
            aws.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        if not batch:
            time.sleep(0.02)
    time.sleep(0.1)  # nothing more arrives
    assert aws.messages(queue_url) == []
    return bodies


class RecordingSqs:
    """moto's SQS, keeping each SendMessageBatch call's entries."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        self.calls: list[list[dict[str, str]]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        self.calls.append(Entries)
        return dict(self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries))


def test_submit_packs_large_requests_within_the_batch_byte_cap(
    aws: Aws, client: Client, requests_queue: str
) -> None:
    """Ten 120 KiB requests are 1.2 MB together: more than one SendMessageBatch may carry.
    (moto takes oversized batches; SQS refuses them, so the calls are checked here.)"""
    recording = RecordingSqs(aws.sqs)
    client.aio._aws.sqs = recording
    big = "x" * 120 * 1024
    requests = [
        ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a", files={"blob.txt": big})
        for i in range(10)
    ]
    small = ExecutionRequest(request_id="tiny", task_ref="t@v/a")
    handles = client.submit([*requests, small])
    assert [h.request_id for h in handles] == [*(f"r{i}" for i in range(10)), "tiny"]
    bodies = queued_bodies(aws, requests_queue, 11)
    assert sorted(str(b["request_id"]) for b in bodies) == sorted(
        ["tiny", *(f"r{i}" for i in range(10))]
    )
    assert all(b["files"] == {"blob.txt": big} for b in bodies if b["request_id"] != "tiny")
    assert all(h.sent and not h.done() for h in handles)
    assert len(recording.calls) >= 5  # two 120 KiB bodies at most per call
    for entries in recording.calls:
        assert len(entries) <= MAX_BATCH_ENTRIES
        assert sum(len(e["MessageBody"].encode()) for e in entries) <= MAX_BATCH_BYTES
    sent = [json.loads(e["MessageBody"])["request_id"] for call in recording.calls for e in call]
    assert sent == [h.request_id for h in handles]  # each once, in order


def test_submit_sends_at_most_ten_entries_per_batch(
    aws: Aws, client: Client, requests_queue: str
) -> None:
    recording = RecordingSqs(aws.sqs)
    client.aio._aws.sqs = recording
    client.submit([ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a") for i in range(23)])
    assert len(queued_bodies(aws, requests_queue, 23)) == 23
    assert [len(entries) for entries in recording.calls] == [10, 10, 3]


def test_a_request_over_128_kib_travels_through_s3_by_content(
    aws: Aws, client: Client, requests_queue: str
) -> None:
    huge = ExecutionRequest(request_id="huge", task_ref="t@v/a", files={"a.py": "#" * 200_000})
    client.submit([huge])
    (body,) = queued_bodies(aws, requests_queue, 1)
    key = keys.payload_key(huge.content_sha256())
    assert body == {"request_id": "huge", "payload_uri": f"s3://traces/{key}"}
    stored = aws.s3.get_object(Bucket="traces", Key=key)["Body"].read()
    assert ExecutionRequest.model_validate_json(stored) == huge


class FlakySqs:
    """moto's SQS, except that the first `failing` SendMessageBatch calls fail their first
    entry (sending the rest)."""

    def __init__(self, sqs: Any, sender_fault: bool, failing: int) -> None:
        self.sqs, self.sender_fault, self.failing, self.calls = sqs, sender_fault, failing, 0

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        self.calls += 1
        if self.calls > self.failing:
            return dict(self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries))
        answer: dict[str, Any] = {"Successful": []}
        if Entries[1:]:
            answer = dict(self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries[1:]))
        failed = {"Id": Entries[0]["Id"], "SenderFault": self.sender_fault, "Code": "X"}
        return answer | {"Failed": [failed | {"Message": "refused"}]}


def test_submit_resends_transient_failures(aws: Aws, client: Client, requests_queue: str) -> None:
    flaky = FlakySqs(aws.sqs, sender_fault=False, failing=2)
    client.aio._aws.sqs = flaky
    handles = client.submit(
        [ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a") for i in range(3)]
    )
    bodies = queued_bodies(aws, requests_queue, 3)
    assert sorted(str(b["request_id"]) for b in bodies) == ["r0", "r1", "r2"]
    assert flaky.calls == 3  # r0 sent again twice, alone
    assert not any(h.done() for h in handles)  # sent, waiting for results


@pytest.mark.parametrize(("sender_fault", "calls"), [(True, 1), (False, 3)])
def test_submit_names_the_requests_sqs_refused_for_good(
    aws: Aws, client: Client, requests_queue: str, sender_fault: bool, calls: int
) -> None:
    """A sender fault is not sent again; a failure on SQS's side is, up to three calls."""
    flaky = FlakySqs(aws.sqs, sender_fault, failing=3)
    client.aio._aws.sqs = flaky
    handles = client.submit(
        [ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a") for i in range(3)]
    )
    message = r"^SendMessageBatch refused r0 \(X: refused\): it was not sent$"
    with pytest.raises(AwsCallError, match=message):
        handles[0].result(timeout=10)
    assert flaky.calls == calls
    assert [h.done() for h in handles] == [True, False, False]  # the others were sent
    assert sorted(str(b["request_id"]) for b in queued_bodies(aws, requests_queue, 2)) == [
        "r1",
        "r2",
    ]
