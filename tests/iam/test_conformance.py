"""Least privilege, proven call by call: every AWS call a twin run records is allowed to the
principal that made it by that principal's statements in the synthesized template, and every
grant in those statements is used by a recorded call, or listed in `UNUSED` with the reason no
twin run can use it."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.iam.checker import Need, Unused, denied, unused
from tests.iam.operations import UnmappedOperation, needs, parse
from tests.iam.policies import SDK, STATE_MACHINES, WORKER, TemplatePolicies
from tests.iam.recording import (
    BROKEN,
    DEAD_LETTERED,
    GHOST,
    HARNESS,
    SETTLED,
    WAITED,
    Recorded,
)
from trialbox.local import principals
from trialbox.models import Status

XRAY = "active tracing: the twin runs with POWERTOOLS_TRACE_DISABLED, so nothing is sent"
LOGS = (
    "the service writes the principal's logs (Lambda, the awslogs driver, Step Functions log "
    "delivery); the twin keeps them in local files"
)
EVENT_SOURCE = (
    "SqsEventSource grants grant_consume_messages to the function; Lambda's poller calls "
    "ReceiveMessage, DeleteMessage and GetQueueAttributes. Narrowing it means an event source "
    "mapping without the L2"
)
# Grants no twin run can use, each with its reason. The only list of grants in this test.
UNUSED = [
    Unused("*", "xray:*", "*", XRAY),
    Unused("*", "logs:*", "*", LOGS),
    Unused(
        "function AWS679f53fac002430cb0da5b7982bd2287*",
        "*",
        "*",
        "CDK's AwsCustomResource provider: runs once at deploy time, never during a run",
    ),
    Unused(
        SDK,
        "cloudformation:DescribeStacks",
        "*",
        "Client.from_stack (trialbox run --stack): the twin has no CloudFormation; its "
        "outputs come from the services process",
    ),
    *(
        Unused(
            "function Reaper*",
            action,
            resource,
            "the reaper looks at an admitted request's execution only 10 minutes after its "
            "admission (admission.STALE_S), past the twin run: tests/integration/"
            "test_admission.py runs that path under moto",
        )
        for action, resource in (
            ("states:DescribeExecution", "arn:aws:states:*:*:execution:OrchestrationRollout*"),
            ("states:DescribeExecution", "arn:aws:states:*:*:execution:Trialbox-Batch*"),
            ("dynamodb:PutItem", "arn:aws:dynamodb:*:*:table/StorageExecutions*"),
        )
    ),
    *(
        Unused(f"function {function}*", action, f"arn:aws:sqs:*:*:{queue}*", EVENT_SOURCE)
        for function, queue in (
            ("Dispatcher", "IntakeRequests"),
            ("DeadLetters", "IntakeRequests"),
            ("Finisher", "FinishQueue"),
        )
        for action in ("sqs:ChangeMessageVisibility", "sqs:GetQueueUrl")
    ),
    *(
        Unused(
            SDK,
            action,
            "arn:aws:lambda:*:function:RunCodeFunction*",
            "the RunCode function URL (trialbox sandbox-fusion-proxy): the twin serves function "
            "URLs outside moto, so no request of the SDK's is recorded; "
            "tests/infra/test_stack.py checks the grant against the URL's auth type",
        )
        for action in ("lambda:InvokeFunctionUrl", "lambda:InvokeFunction")
    ),
    Unused(
        WORKER,
        "sqs:ChangeMessageVisibility",
        "arn:aws:sqs:*:*:PoolOpensQueue*",
        "an open goes back to the queue only when a worker took it and cannot host it (told "
        "to stop during the long poll, its inbox not made, or under rlimit a job came first): "
        "tests/integration/test_opener.py runs each",
    ),
    Unused(
        WORKER,
        "ecs:UpdateTaskProtection",
        "*",
        "task scale-in protection goes through the ECS agent, which the twin does not have "
        "(tests/unit/test_protection.py calls a stand-in)",
    ),
    Unused(
        STATE_MACHINES,
        "lambda:InvokeFunction",
        "arn:aws:lambda:*:function:*:*",
        "CDK's LambdaInvoke also grants the functions' versions and aliases; the Rollout "
        "invokes the unqualified ARNs",
    ),
]


def principal_needs(recorded: Recorded) -> tuple[dict[str, list[Need]], list[str]]:
    """Each principal's needs, by access key id, and what could not be attributed."""
    found: dict[str, list[Need]] = {}
    problems = []
    for entry in recorded.entries:
        if entry["key"] in (principals.SETUP, HARNESS):
            continue
        try:
            found.setdefault(entry["key"], []).extend(needs(parse(entry), recorded.tokens))
        except UnmappedOperation as exc:
            problems.append(f"{entry['key']}: {exc}")
    return found, sorted(set(problems))


@pytest.fixture(scope="module")
def policies(recorded: Recorded) -> TemplatePolicies:
    return TemplatePolicies(recorded.template)


def test_the_run_took_every_path_and_every_principal_called(recorded: Recorded) -> None:
    status = {rid: (r.status, r.reward) for rid, r in recorded.results.items()}
    assert status == {
        "iam-good": (Status.SUCCEEDED, 1.0),
        "iam-wrong": (Status.SUCCEEDED, 0.5),
        "iam-big": (Status.SUCCEEDED, 1.0),
        "iam-rawbig": (Status.SUCCEEDED, 1.0),
        "iam-noref": (Status.REJECTED, None),
        "iam-nockpt": (Status.REJECTED, None),
        "iam-turn": (Status.SUCCEEDED, 0.5),
        "iam-session-grade": (Status.SUCCEEDED, 1.0),
        BROKEN: (Status.SANDBOX_ERROR, None),
        "iam-invalid": (Status.REJECTED, None),
        "iam-norecord": (Status.SANDBOX_ERROR, None),
        "iam-cancel": (Status.CANCELLED, None),
        DEAD_LETTERED: (Status.SANDBOX_ERROR, None),
        "iam-b-noref": (Status.REJECTED, None),
        "iam-b-nockpt": (Status.REJECTED, None),
        "iam-b-big": (Status.SUCCEEDED, 1.0),
        f"{BROKEN}-b": (Status.SANDBOX_ERROR, None),
        "iam-b-slow": (Status.SUCCEEDED, 1.0),
        "iam-b-wrong": (Status.SUCCEEDED, 0.5),
        GHOST: (Status.CANCELLED, None),
        WAITED: (Status.CANCELLED, None),
        **{request_id: (Status.SANDBOX_ERROR, None) for request_id in SETTLED},
    }
    assert (recorded.cli_exit, len(recorded.cli_traces)) == (0, 2)
    callers = Counter(e["key"] for e in recorded.entries)
    functions = {k for k in callers if k.startswith(principals.FUNCTION_PREFIX)}
    # dispatcher, prepare, recorder, reaper, run_code, dead_letters, a batch's run,
    # finisher and settle, and the pool's scaler
    assert len(functions) == 10
    # The scaler read the demand, turned idle, saw work again and set the service's count.
    (scaler,) = [k for k in functions if k.startswith(principals.function("ScalerFunction"))]
    assert {parse(e).operation for e in recorded.entries if e["key"] == scaler} == {
        "GetQueueAttributes",
        "BatchGetItem",
        "GetMetricData",
        "GetItem",
        "PutItem",
        "DeleteItem",
        "DescribeServices",
        "UpdateService",
    }
    for key in (principals.SDK, principals.WORKER, principals.STATE_MACHINES):
        assert callers[key] > 0, f"no call recorded from {key}"


def test_every_call_is_attributed_and_mapped(
    recorded: Recorded, policies: TemplatePolicies
) -> None:
    found, problems = principal_needs(recorded)
    known = policies.principals()
    strangers = sorted(f"calls signed {k!r}: no principal of the template" for k in found
                       if k not in known)  # fmt: skip
    assert not problems + strangers, "\n".join(problems + strangers)


def test_every_call_is_allowed_for_its_principal(
    recorded: Recorded, policies: TemplatePolicies
) -> None:
    found, _ = principal_needs(recorded)
    known = policies.principals()
    refused = [line for key, principal in known.items()
               for line in denied(principal, found.get(key, []))]  # fmt: skip
    assert not refused, "\n".join(refused)


def test_every_grant_is_used_or_listed_with_its_reason(
    recorded: Recorded, policies: TemplatePolicies
) -> None:
    found, _ = principal_needs(recorded)
    known = policies.principals()
    by_name = {p.name: p for p in known.values()}
    needs_by_name = {known[k].name: v for k, v in found.items() if k in known}
    findings, stale = unused(by_name, needs_by_name, UNUSED)
    assert not findings, "\n".join(findings)
    assert not stale, "\n".join(f"allow-list entry excuses nothing: {e}" for e in stale)


def test_the_principals_are_the_templates(policies: TemplatePolicies) -> None:
    names = {p.name for p in policies.principals().values()}
    assert {SDK, WORKER, STATE_MACHINES} <= names
    assert len([n for n in names if n.startswith("function ")]) >= 4
