"""The SDK against moto in-process: stack outputs and reading traces."""

from __future__ import annotations

import json
import warnings
from typing import Any

import boto3
import pytest

from tests.integration.conftest import Aws
from trialbox import __version__
from trialbox import constants as c
from trialbox.client import AwsCallError, Client, Resources
from trialbox.driver import default_concurrency
from trialbox.errors import StackVersionMismatch, TrialboxError, UnversionedStackWarning
from trialbox.models import ExecutionRequest

OUTPUTS = {
    c.OUTPUT_REQUESTS_QUEUE_URL: "https://sqs.us-east-1.amazonaws.com/123456789012/requests",
    c.OUTPUT_EXECUTIONS_TABLE: "executions",
    c.OUTPUT_TRACES_BUCKET: "traces",
    c.OUTPUT_TASKSETS_BUCKET: "tasksets",
    c.OUTPUT_STACK_VERSION: __version__,
}
SERIES = ".".join(__version__.split(".")[:2])


def deploy(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def test_from_stack_reads_the_outputs(aws: Aws) -> None:
    deploy("Trialbox", OUTPUTS)
    client = Client.from_stack("Trialbox")
    assert client.resources == Resources.from_outputs(OUTPUTS)
    assert client.capacity is None


def test_the_stack_pool_size_sets_the_default_concurrency(aws: Aws) -> None:
    deploy("Sized", OUTPUTS | {c.OUTPUT_POOL_CAPACITY: "10"})
    client = Client.from_stack("Sized")
    assert (client.capacity, client.is_local) == (10, False)
    assert default_concurrency(client.capacity) == 40


def test_pool_capacity_from_the_environment_and_a_bad_one_named(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {
        "TRIALBOX_REQUESTS_QUEUE_URL": OUTPUTS[c.OUTPUT_REQUESTS_QUEUE_URL],
        "TRIALBOX_EXECUTIONS_TABLE": "executions",
        "TRIALBOX_TRACES_BUCKET": "traces",
        "TRIALBOX_TASKSETS_BUCKET": "tasksets",
    }
    for name, value in names.items():
        monkeypatch.setenv(name, value)
    assert Client().capacity is None
    monkeypatch.setenv("TRIALBOX_POOL_CAPACITY", "3")
    assert Client().capacity == 3
    monkeypatch.setenv("TRIALBOX_POOL_CAPACITY", "lots")
    with pytest.raises(TrialboxError, match="TRIALBOX_POOL_CAPACITY must be a positive number"):
        Client()


def test_from_stack_refuses_a_stack_of_another_major_minor(aws: Aws) -> None:
    deploy("Newer", OUTPUTS | {c.OUTPUT_STACK_VERSION: "9.9.0"})
    with pytest.raises(StackVersionMismatch) as raised:
        Client.from_stack("Newer")
    assert str(raised.value) == (
        f"stack 'Newer' was deployed by trialbox 9.9.0, but this SDK is {__version__}: "
        "major.minor must match. Install the stack's version (pip install 'trialbox==9.9.*'), "
        f"or deploy this version's stack (npx aws-cdk deploy from a trialbox {SERIES} checkout)."
    )
    assert isinstance(raised.value, TrialboxError)


def test_from_stack_accepts_another_patch_release_silently(aws: Aws) -> None:
    deploy("Patched", OUTPUTS | {c.OUTPUT_STACK_VERSION: f"{SERIES}.99"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Client.from_stack("Patched").resources == Resources.from_outputs(OUTPUTS)


def test_from_stack_warns_about_a_stack_without_a_version(aws: Aws) -> None:
    unversioned = {k: v for k, v in OUTPUTS.items() if k != c.OUTPUT_STACK_VERSION}
    deploy("Older", unversioned)
    with pytest.warns(UnversionedStackWarning) as caught:
        client = Client.from_stack("Older")
    assert client.resources == Resources.from_outputs(unversioned)
    assert [str(w.message) for w in caught] == [
        "stack 'Older' has no TrialboxVersion output (deployed by a trialbox older than this "
        f"check), so it cannot be checked against this SDK ({__version__}); redeploy it from "
        "this version to be sure they match"
    ]
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


def test_read_object_returns_a_trace_and_rejects_other_uris(aws: Aws) -> None:
    client = Client(Resources.from_outputs(OUTPUTS))
    aws.s3.put_object(Bucket="traces", Key="traces/r1.json", Body=b'{"ok": 1}')
    assert client.read_object("s3://traces/traces/r1.json") == b'{"ok": 1}'
    with pytest.raises(TrialboxError, match="not an s3://bucket/key URI"):
        client.read_object("/tmp/r1.json")
    with pytest.raises(AwsCallError, match="get_object"):
        client.read_object("s3://traces/traces/missing.json")


def queued_bodies(aws: Aws, queue_url: str) -> list[dict[str, object]]:
    bodies: list[dict[str, object]] = []
    while batch := aws.messages(queue_url):
        bodies += [json.loads(m["Body"]) for m in batch]
        for m in batch:
            aws.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
    return bodies


def test_submit_packs_large_requests_within_the_batch_byte_cap(aws: Aws) -> None:
    """Ten 120 KiB requests are 1.2 MB together: more than one SendMessageBatch may carry."""
    queue = aws.sqs.create_queue(QueueName="requests")["QueueUrl"]
    client = Client(Resources.from_outputs(OUTPUTS | {c.OUTPUT_REQUESTS_QUEUE_URL: queue}))
    big = "x" * 120 * 1024
    requests = [
        ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a", files={"blob.txt": big})
        for i in range(10)
    ]
    small = ExecutionRequest(request_id="tiny", task_ref="t@v/a")
    assert client.submit([*requests, small]) == [*(f"r{i}" for i in range(10)), "tiny"]
    bodies = queued_bodies(aws, queue)
    assert sorted(str(b["request_id"]) for b in bodies) == sorted(
        ["tiny", *(f"r{i}" for i in range(10))]
    )
    assert all(b["files"] == {"blob.txt": big} for b in bodies if b["request_id"] != "tiny")


class FlakySqs:
    """moto's SQS, except that the first SendMessageBatch fails its first entry."""

    def __init__(self, sqs: Any, sender_fault: bool) -> None:
        self.sqs, self.sender_fault, self.calls = sqs, sender_fault, 0

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        self.calls += 1
        if self.calls > 1:
            return dict(self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries))
        answer = dict(self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries[1:]))
        failed = {"Id": Entries[0]["Id"], "SenderFault": self.sender_fault, "Code": "X"}
        return answer | {"Failed": [failed | {"Message": "refused"}]}


@pytest.mark.parametrize("sender_fault", [False, True])
def test_submit_resends_transient_failures_and_names_permanent_ones(
    aws: Aws, sender_fault: bool
) -> None:
    queue = aws.sqs.create_queue(QueueName="requests")["QueueUrl"]
    client = Client(Resources.from_outputs(OUTPUTS | {c.OUTPUT_REQUESTS_QUEUE_URL: queue}))
    client._clients["sqs"] = FlakySqs(aws.sqs, sender_fault)
    requests = [ExecutionRequest(request_id=f"r{i}", task_ref="t@v/a") for i in range(3)]
    if sender_fault:
        message = (
            r"SendMessageBatch refused r0 \(X: refused\); 2 other request\(s\) were sent and "
            r"the 0 after them were not"
        )
        with pytest.raises(AwsCallError, match=message):
            client.submit(requests)
        assert sorted(str(b["request_id"]) for b in queued_bodies(aws, queue)) == ["r1", "r2"]
    else:
        assert client.submit(requests) == ["r0", "r1", "r2"]
        assert sorted(str(b["request_id"]) for b in queued_bodies(aws, queue)) == ["r0", "r1", "r2"]
