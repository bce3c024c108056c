"""The SDK against moto in-process: stack outputs and reading traces."""

from __future__ import annotations

import json

import boto3
import pytest

from tests.integration.conftest import Aws
from trialbox import constants as c
from trialbox.client import AwsCallError, Client, Resources
from trialbox.errors import TrialboxError

OUTPUTS = {
    c.OUTPUT_REQUESTS_QUEUE_URL: "https://sqs.us-east-1.amazonaws.com/123456789012/requests",
    c.OUTPUT_EXECUTIONS_TABLE: "executions",
    c.OUTPUT_TRACES_BUCKET: "traces",
    c.OUTPUT_TASKSETS_BUCKET: "tasksets",
}


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
