"""From the twin's request log to the (action, resource) pairs each call needs.

A logged request names its operation by protocol: the X-Amz-Target header (JSON protocol), an
`Action` form field (query protocol), or the method and path matched against botocore's own
operation model (REST: S3, Lambda). Each operation's IAM actions come from one explicit table,
`ACTIONS`; an operation missing from it is a failure that names it, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import parse_qs, urlparse

import botocore.session

from tests.iam.checker import Need
from trialbox.local.resources import ACCOUNT, REGION

# The signing name in a SigV4 credential scope, where it differs from botocore's service name.
SERVICES = {"states": "stepfunctions"}

# (service, operation) -> the IAM actions it is authorized by (the Service Authorization
# Reference's "actions" table, where an API and an action differ in name).
ACTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("sqs", "SendMessage"): ("sqs:SendMessage",),
    ("sqs", "SendMessageBatch"): ("sqs:SendMessage",),
    ("sqs", "ReceiveMessage"): ("sqs:ReceiveMessage",),
    ("sqs", "DeleteMessage"): ("sqs:DeleteMessage",),
    ("sqs", "DeleteMessageBatch"): ("sqs:DeleteMessage",),
    ("sqs", "ChangeMessageVisibility"): ("sqs:ChangeMessageVisibility",),
    ("sqs", "ChangeMessageVisibilityBatch"): ("sqs:ChangeMessageVisibility",),
    ("sqs", "GetQueueAttributes"): ("sqs:GetQueueAttributes",),
    ("sqs", "GetQueueUrl"): ("sqs:GetQueueUrl",),
    # A CreateQueue that tags the queue (the SDK's always does) needs TagQueue too.
    ("sqs", "CreateQueue"): ("sqs:CreateQueue", "sqs:TagQueue"),
    ("sqs", "DeleteQueue"): ("sqs:DeleteQueue",),
    ("sqs", "ListQueues"): ("sqs:ListQueues",),
    ("sqs", "ListQueueTags"): ("sqs:ListQueueTags",),
    ("ecs", "DescribeTasks"): ("ecs:DescribeTasks",),
    ("s3", "PutObject"): ("s3:PutObject",),
    ("s3", "GetObject"): ("s3:GetObject",),
    ("s3", "HeadObject"): ("s3:GetObject",),
    ("s3", "DeleteObject"): ("s3:DeleteObject",),
    ("s3", "ListObjectsV2"): ("s3:ListBucket",),
    ("s3", "ListObjects"): ("s3:ListBucket",),
    ("s3", "HeadBucket"): ("s3:ListBucket",),
    ("s3", "CreateMultipartUpload"): ("s3:PutObject",),
    ("s3", "UploadPart"): ("s3:PutObject",),
    ("s3", "CompleteMultipartUpload"): ("s3:PutObject",),
    ("s3", "AbortMultipartUpload"): ("s3:AbortMultipartUpload",),
    ("dynamodb", "PutItem"): ("dynamodb:PutItem",),
    ("dynamodb", "GetItem"): ("dynamodb:GetItem",),
    ("dynamodb", "BatchGetItem"): ("dynamodb:BatchGetItem",),
    ("dynamodb", "UpdateItem"): ("dynamodb:UpdateItem",),
    ("dynamodb", "DeleteItem"): ("dynamodb:DeleteItem",),
    ("dynamodb", "Query"): ("dynamodb:Query",),
    ("stepfunctions", "StartExecution"): ("states:StartExecution",),
    ("stepfunctions", "DescribeExecution"): ("states:DescribeExecution",),
    ("stepfunctions", "StopExecution"): ("states:StopExecution",),
    ("stepfunctions", "SendTaskSuccess"): ("states:SendTaskSuccess",),
    ("stepfunctions", "SendTaskFailure"): ("states:SendTaskFailure",),
    ("stepfunctions", "SendTaskHeartbeat"): ("states:SendTaskHeartbeat",),
    ("lambda", "Invoke"): ("lambda:InvokeFunction",),
    ("cloudformation", "DescribeStacks"): ("cloudformation:DescribeStacks",),
}
# An object read the twin answered 404: AWS answers NoSuchKey (404) only to a caller that may
# also list the bucket, and AccessDenied (403) otherwise. The code branches on NoSuchKey (a
# task set not found is a rejection), so the twin's answer is faithful only with ListBucket.
NOT_FOUND_NEEDS_LIST = {("s3", "GetObject"), ("s3", "HeadObject")}
TASK_TOKEN_OPERATIONS = {"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"}


class UnmappedOperation(Exception):
    pass


@dataclass(frozen=True)
class Call:
    key: str  # the caller's access key id (trialbox.local.principals)
    service: str  # botocore's name
    operation: str
    params: dict[str, Any] = field(default_factory=dict)
    status: int | None = None

    def __str__(self) -> str:
        shown = {k: v for k, v in self.params.items() if isinstance(v, str) and len(v) < 120}
        return f"{self.service}:{self.operation} {shown}"


@cache
def _model(service: str) -> Any:
    return botocore.session.get_session().get_service_model(service)


Route = tuple[str, re.Pattern[str], frozenset[str], frozenset[str], int, str]


def _required_headers(operation: Any) -> frozenset[str]:
    shape = operation.input_shape
    if shape is None:
        return frozenset()
    return frozenset(
        shape.members[m].serialization.get("name", m).lower()
        for m in shape.required_members
        if shape.members[m].serialization.get("location") == "header"
    )


@cache
def _routes(service: str) -> list[Route]:
    """(method, path regex, query keys required, headers required, literal length, operation)
    for a REST service, most specific first."""
    model = _model(service)
    routes = []
    for name in model.operation_names:
        operation = model.operation_model(name)
        http = operation.http
        path, _, query = http["requestUri"].partition("?")
        regex = re.sub(
            r"\\\{(\w+)(\\\+)?\\\}",
            lambda m: f"(?P<{m.group(1)}>{'.+' if m.group(2) else '[^/]+'})",
            re.escape(path),
        )
        keys = frozenset(part.split("=", 1)[0] for part in query.split("&") if part)
        literal = len(re.sub(r"\{[^}]+\}", "", path))
        headers = _required_headers(operation)
        routes.append((http["method"], re.compile(regex), keys, headers, literal, name))
    routes.sort(key=lambda r: (-len(r[2]), -len(r[3]), -r[4]))
    return routes


def parse(entry: dict[str, Any]) -> Call:
    """One request-log line as a call: its operation and parameters."""
    service = SERVICES.get(entry["service"], entry["service"])
    body = entry.get("body") or {}
    if entry.get("target"):
        operation = entry["target"].rsplit(".", 1)[-1]
        return Call(entry["key"], service, operation, body, entry.get("status"))
    if isinstance(body, dict) and "Action" in body:
        return Call(entry["key"], service, body["Action"], body, entry.get("status"))
    query = parse_qs(entry.get("query", ""), keep_blank_values=True)
    path = entry["path"] or "/"
    if service == "s3" and path.endswith("/") and path.count("/") == 2:
        path = path[:-1]  # "/bucket/" is the bucket
    headers = set(entry.get("headers", []))
    for method, regex, keys, needed, _, operation in _routes(service):
        found = regex.fullmatch(path)
        if method == entry["method"] and found and keys <= set(query) and needed <= headers:
            params = dict(found.groupdict()) | {k: v[0] for k, v in query.items()}
            return Call(entry["key"], service, operation, params, entry.get("status"))
    raise UnmappedOperation(f"{service}: {entry['method']} {entry['path']}?{entry['query']}")


def queue_arn(url: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{urlparse(url).path.rstrip('/').rsplit('/', 1)[-1]}"


def table_arn(name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"


def function_arn(name: str, qualifier: str | None) -> str:
    arn = name if name.startswith("arn:") else f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    return f"{arn}:{qualifier}" if qualifier else arn


def resources(call: Call, tokens: dict[str, str]) -> list[str]:
    """The ARNs a call acts on. `tokens`: task token -> the state machine that issued it."""
    p = call.params
    if call.service == "sqs":
        if call.operation == "ListQueues":  # names no queue: IAM takes only "*"
            return ["*"]
        if call.operation in ("GetQueueUrl", "CreateQueue"):
            return [f"arn:aws:sqs:{REGION}:{ACCOUNT}:{p['QueueName']}"]
        return [queue_arn(p["QueueUrl"])]
    if call.service == "s3":
        if "Key" in p:
            return [f"arn:aws:s3:::{p['Bucket']}/{p['Key']}"]
        return [f"arn:aws:s3:::{p['Bucket']}"]
    if call.service == "dynamodb":
        if "RequestItems" in p:
            return [table_arn(name) for name in p["RequestItems"]]
        return [table_arn(p["TableName"])]
    if call.service == "stepfunctions":
        if call.operation in TASK_TOKEN_OPERATIONS:
            # A task token is authorized against the state machine whose task issued it.
            token = p["taskToken"]
            if token not in tokens:
                raise UnmappedOperation(f"{call.operation}: no state machine issued its token")
            return [tokens[token]]
        return [p.get("stateMachineArn") or p["executionArn"]]
    if call.service == "lambda":
        return [function_arn(p["FunctionName"], p.get("Qualifier"))]
    if call.service == "ecs":  # DescribeTasks: the tasks named (ARNs, in the SDK's calls)
        return [str(t) for t in p["tasks"]]
    if call.service == "cloudformation":
        return [f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{p['StackName']}/*"]
    raise UnmappedOperation(f"{call.service}:{call.operation}: no resource rule")


# TransactWriteItems has no action of its own: each item needs its kind's action on its table.
TRANSACT_ITEM_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def needs(call: Call, tokens: dict[str, str]) -> list[Need]:
    """Every (action, resource) the call needs; UnmappedOperation names what is missing."""
    if (call.service, call.operation) == ("dynamodb", "TransactWriteItems"):
        return [
            Need(TRANSACT_ITEM_ACTIONS[kind], table_arn(item["TableName"]), str(call))
            for entry in call.params["TransactItems"]
            for kind, item in entry.items()
        ]
    actions = ACTIONS.get((call.service, call.operation))
    if actions is None:
        raise UnmappedOperation(f"{call.service}:{call.operation} is not in the action table")
    found = [Need(a, r, str(call)) for a in actions for r in resources(call, tokens)]
    if (call.service, call.operation) in NOT_FOUND_NEEDS_LIST and call.status == 404:
        bucket = f"arn:aws:s3:::{call.params['Bucket']}"
        found.append(Need("s3:ListBucket", bucket, f"{call} (answered 404 NoSuchKey)"))
    return found
