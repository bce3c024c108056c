"""From the twin's request log to the (action, resource) pairs each call needs.

A logged request's operation is read by trialbox.local.requestlog.parse. Each operation's IAM
actions come from one explicit table,
`ACTIONS`; an operation missing from it is a failure that names it, never a guess.
"""

from __future__ import annotations

from urllib.parse import urlparse

from tests.iam.checker import Need
from trialbox.local.requestlog import Call, UnmappedOperation, parse
from trialbox.local.resources import ACCOUNT, REGION

__all__ = ["Call", "UnmappedOperation", "needs", "parse", "queue_arn"]

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
    ("sqs", "TagQueue"): ("sqs:TagQueue",),
    # A CreateQueue that tags the queue (the SDK's always does) needs TagQueue too.
    ("sqs", "CreateQueue"): ("sqs:CreateQueue", "sqs:TagQueue"),
    ("sqs", "DeleteQueue"): ("sqs:DeleteQueue",),
    ("sqs", "ListQueues"): ("sqs:ListQueues",),
    ("sqs", "ListQueueTags"): ("sqs:ListQueueTags",),
    ("ecs", "DescribeTasks"): ("ecs:DescribeTasks",),
    ("ecs", "DescribeServices"): ("ecs:DescribeServices",),
    ("ecs", "UpdateService"): ("ecs:UpdateService",),
    ("cloudwatch", "GetMetricData"): ("cloudwatch:GetMetricData",),
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


def queue_arn(url: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{urlparse(url).path.rstrip('/').rsplit('/', 1)[-1]}"


def service_arn(cluster: str, service: str) -> str:
    if service.startswith("arn:"):
        return service
    return f"arn:aws:ecs:{REGION}:{ACCOUNT}:service/{cluster.rsplit('/', 1)[-1]}/{service}"


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
    if call.service == "ecs":
        if call.operation == "DescribeServices":  # the services named, in their cluster
            return [service_arn(p["cluster"], str(s)) for s in p["services"]]
        if call.operation == "UpdateService":
            return [service_arn(p["cluster"], str(p["service"]))]
        return [str(t) for t in p["tasks"]]  # DescribeTasks: the tasks named (ARNs)
    if call.service == "cloudwatch":  # GetMetricData names no resource: IAM takes only "*"
        return ["*"]
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
