"""The checker on its own: each kind of violation fails, with the message a reader sees."""

from __future__ import annotations

from typing import Any

import pytest

from tests.iam.checker import Need, Principal, Statement, Unused, denied, unused
from tests.iam.operations import UnmappedOperation, needs, parse
from tests.iam.policies import TemplatePolicies, UnsupportedPolicy

QUEUE = "arn:aws:sqs:us-east-1:123456789012:Requests"
BUCKET = "arn:aws:s3:::traces"


def principal(*statements: Statement) -> Principal:
    return Principal("sdk", list(statements))


def allow(actions: tuple[str, ...], resources: tuple[str, ...]) -> Statement:
    return Statement("Allow", actions, resources, "Policy")


def test_a_call_whose_action_is_not_granted_is_denied() -> None:
    sdk = principal(allow(("sqs:SendMessage",), (QUEUE,)))
    found = denied(sdk, [Need("sqs:ReceiveMessage", QUEUE, "ReceiveMessage")])
    assert found == [f"sdk: sqs:ReceiveMessage on {QUEUE} (for ReceiveMessage) is not allowed"]


def test_a_resource_outside_the_pattern_is_denied() -> None:
    sdk = principal(allow(("s3:GetObject",), (f"{BUCKET}/traces/*",)))
    assert denied(sdk, [Need("s3:GetObject", f"{BUCKET}/traces/a.json", "GetObject")]) == []
    outside = Need("s3:GetObject", f"{BUCKET}/jobs/a/job.json", "GetObject")
    assert denied(sdk, [outside]) == [
        f"sdk: s3:GetObject on {BUCKET}/jobs/a/job.json (for GetObject) is not allowed"
    ]


def test_wildcards_follow_iam() -> None:
    sdk = principal(allow(("S3:Get*",), (f"{BUCKET}/jobs/*/job.json", f"{BUCKET}/t?.json")))
    ok = [Need("s3:GetObject", f"{BUCKET}/jobs/a/b/job.json", "x")]  # * spans slashes
    ok.append(Need("s3:getobject", f"{BUCKET}/t1.json", "x"))  # actions ignore case
    assert denied(sdk, ok) == []
    wrong = [Need("s3:GetObject", f"{BUCKET}/t12.json", "x")]  # ? is one character
    wrong.append(Need("s3:GetObject", f"{BUCKET.upper()}/T1.json", "x"))  # resources don't
    assert len(denied(sdk, wrong)) == 2


def test_a_deny_wins_over_an_allow() -> None:
    sdk = principal(
        allow(("s3:*",), (f"{BUCKET}/*",)),
        Statement("Deny", ("s3:GetObject",), (f"{BUCKET}/secret/*",), "Guard"),
    )
    assert denied(sdk, [Need("s3:GetObject", f"{BUCKET}/open/a", "x")]) == []
    assert len(denied(sdk, [Need("s3:GetObject", f"{BUCKET}/secret/a", "x")])) == 1


def test_an_unused_grant_fails_unless_listed_and_a_stale_entry_fails_too() -> None:
    sdk = principal(allow(("sqs:SendMessage", "sqs:GetQueueUrl"), (QUEUE,)))
    used = {"sdk": [Need("sqs:SendMessage", QUEUE, "SendMessageBatch")]}
    findings, stale = unused({"sdk": sdk}, used, [])
    assert findings == [
        f"sdk: sqs:GetQueueUrl on {QUEUE} (Policy) is granted but no recorded call used it"
    ]
    assert stale == []
    excuse = Unused("sdk", "sqs:GetQueue*", "*", "why")
    never = Unused("worker", "*", "*", "excuses nothing")
    findings, stale = unused({"sdk": sdk}, used, [excuse, never])
    assert (findings, stale) == ([], [never])


def test_an_unmapped_operation_fails_with_its_name() -> None:
    entry = {"key": "local", "service": "sqs", "target": "AmazonSQS.PurgeQueue"}
    call = parse(entry | {"body": {"QueueUrl": "http://h/123456789012/Requests"}})
    with pytest.raises(UnmappedOperation, match="sqs:PurgeQueue is not in the action table"):
        needs(call, {})


def test_operations_map_to_their_iam_actions_and_resources() -> None:
    url = "http://127.0.0.1:5000/123456789012/Requests"
    batch: dict[str, Any] = {"key": "k", "service": "sqs", "target": "AmazonSQS.SendMessageBatch"}
    batch |= {"body": {"QueueUrl": url, "Entries": []}}
    assert [(n.action, n.resource) for n in needs(parse(batch), {})] == [("sqs:SendMessage", QUEUE)]
    head = {"key": "k", "service": "s3", "method": "HEAD", "path": "/traces/jobs/a/job.json"}
    assert [(n.action, n.resource) for n in needs(parse(head | {"query": ""}), {})] == [
        ("s3:GetObject", f"{BUCKET}/jobs/a/job.json")
    ]
    missing = head | {"method": "GET", "query": "", "status": 404}
    assert [n.action for n in needs(parse(missing), {})] == ["s3:GetObject", "s3:ListBucket"]
    beat: dict[str, Any] = {"key": "k", "service": "states", "body": {"taskToken": "t1"}}
    beat["target"] = "AWSStepFunctions.SendTaskHeartbeat"
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:Rollout"
    assert [(n.action, n.resource) for n in needs(parse(beat), {"t1": machine})] == [
        ("states:SendTaskHeartbeat", machine)
    ]
    with pytest.raises(UnmappedOperation, match="no state machine issued its token"):
        needs(parse(beat), {})


def test_a_not_action_statement_is_refused_rather_than_misread() -> None:
    template = {
        "Resources": {
            "Role": {"Type": "AWS::IAM::Role", "Properties": {}},
            "Policy": {
                "Type": "AWS::IAM::Policy",
                "Properties": {
                    "Roles": [{"Ref": "Role"}],
                    "PolicyDocument": {
                        "Statement": [{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]
                    },
                },
            },
        }
    }
    with pytest.raises(UnsupportedPolicy, match="NotAction"):
        TemplatePolicies(template).role("Role")
