"""The SDK's AWS calls, synchronous and small; the async core runs them in threads.

Every boto3 error becomes an `AwsCallError` naming the call.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

from trialbox import aws_retries, keys
from trialbox.constants import CONTENT_ATTRIBUTE, MAX_INLINE_REQUEST_BYTES, TABLE_KEY
from trialbox.errors import AwsCallError, TrialboxError
from trialbox.models import ExecutionRequest, ExecutionResult
from trialbox.pipeline.claims import Claims
from trialbox.pipeline.record import record
from trialbox.pipeline.stores import ResultTable
from trialbox.sdk.resources import Resources
from trialbox.sqs_batch import batches

SEND_ATTEMPTS = 3
GET_BATCH = 100  # BatchGetItem's most keys per call

# A terminal result (or why its stored item cannot be read), and its request's content hash.
Stored = tuple[ExecutionResult | TrialboxError, str | None]


@dataclass
class Sent:
    """What one `send` did: ids SQS refused for good (with its reason), and ids never
    attempted because a call failed (`error`); every other id reached the queue."""

    refused: dict[str, str] = field(default_factory=dict)
    unattempted: list[str] = field(default_factory=list)
    error: AwsCallError | None = None


def service(session: Any, name: str, endpoint_url: str | None) -> Any:
    try:
        return session.client(name, endpoint_url=endpoint_url, config=aws_retries.config())
    except NoRegionError as exc:
        raise TrialboxError(
            "no AWS region configured: set AWS_REGION (or AWS_DEFAULT_REGION), or pass "
            "region= to from_stack"
        ) from exc


def call(method: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return method(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise AwsCallError(f"{getattr(method, '__name__', 'AWS call')}: {exc}") from exc


class Aws:
    def __init__(self, session: Any, endpoint_url: str | None, resources: Resources) -> None:
        self.resources = resources
        self.session = session
        self.endpoint_url = endpoint_url
        self.sqs = service(session, "sqs", endpoint_url)
        self.dynamodb = service(session, "dynamodb", endpoint_url)

    # Made when first needed: task sets, large requests, traces and cancel.
    @functools.cached_property
    def s3(self) -> Any:
        return service(self.session, "s3", self.endpoint_url)

    @functools.cached_property
    def sfn(self) -> Any:
        return service(self.session, "stepfunctions", self.endpoint_url)

    @functools.cached_property
    def ecs(self) -> Any:
        return service(self.session, "ecs", self.endpoint_url)

    def stop_reason(self, task_arn: str) -> str | None:
        """Why a pool task stopped (its stoppedReason and its containers' reasons), "" when
        ECS does not know the task, or None while it runs. A Fargate task has its reasons
        from the moment it is told to stop, long before it reaches STOPPED."""
        assert self.resources.cluster
        answer = call(self.ecs.describe_tasks, cluster=self.resources.cluster, tasks=[task_arn])
        for task in answer.get("tasks", []):
            reasons = [task.get("stoppedReason")]
            reasons += [c.get("reason") for c in task.get("containers", [])]
            stopping = task.get("desiredStatus") == "STOPPED" or task.get("lastStatus") == "STOPPED"
            if stopping or any(reasons):
                return "; ".join(r for r in reasons if r) or "stopped"
        return None if answer.get("tasks") else ""

    def put_taskset(self, key: str, body: bytes) -> None:
        call(self.s3.put_object, Bucket=self.resources.tasksets_bucket, Key=key, Body=body)

    def read_object(self, uri: str) -> bytes:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not key:
            raise TrialboxError(f"not an s3://bucket/key URI: {uri!r}")
        return bytes(call(self.s3.get_object, Bucket=bucket, Key=key)["Body"].read())

    def message_body(self, request: ExecutionRequest, content_sha256: str) -> str:
        """The request itself, or (over 128 KiB) a pointer to it in S3, keyed by content.
        ASCII JSON: SQS refuses some characters (U+FFFE, U+FFFF) that JSON escapes carry."""
        body = json.dumps(request.model_dump(mode="json", exclude_defaults=True))
        if len(body.encode()) <= MAX_INLINE_REQUEST_BYTES:
            return body
        key = keys.payload_key(content_sha256)
        bucket = self.resources.traces_bucket
        call(self.s3.put_object, Bucket=bucket, Key=key, Body=body.encode())
        return json.dumps({"request_id": request.request_id, "payload_uri": f"s3://{bucket}/{key}"})

    def send(self, bodies: list[tuple[str, str]], queue_url: str | None = None) -> Sent:
        """SendMessageBatch in batches within SQS's caps, to the requests queue unless told;
        entries SQS failed on its side are sent again. Stops at the first call that fails."""
        outcome = Sent()
        pending = list(batches(bodies))
        while pending:
            batch = pending.pop(0)
            try:
                outcome.refused |= self._send_batch(
                    batch, queue_url or self.resources.requests_queue_url
                )
            except AwsCallError as exc:
                outcome.error = exc
                outcome.unattempted = [rid for b in [batch, *pending] for rid, _ in b]
                break
        return outcome

    def _send_batch(self, batch: list[tuple[str, str]], queue_url: str) -> dict[str, str]:
        pending = dict(enumerate(batch))
        for attempt in range(SEND_ATTEMPTS):
            entries = [{"Id": str(i), "MessageBody": body} for i, (_, body) in pending.items()]
            answer = call(self.sqs.send_message_batch, QueueUrl=queue_url, Entries=entries)
            failed = answer.get("Failed", [])
            last = attempt == SEND_ATTEMPTS - 1
            if any(f.get("SenderFault") for f in failed) or (failed and last):
                return {
                    pending[int(f["Id"])][0]: f"{f.get('Code')}: {f.get('Message')}" for f in failed
                }
            pending = {int(f["Id"]): pending[int(f["Id"])] for f in failed}
            if not pending:
                return {}
            time.sleep(0.1 * 2**attempt)
        return {}

    def results(self, request_ids: list[str]) -> dict[str, Stored]:
        """The terminal results that exist now, with each request's content hash."""
        found: dict[str, Stored] = {}
        table = self.resources.executions_table
        for start in range(0, len(request_ids), GET_BATCH):
            keys_: list[dict[str, Any]] = [
                {TABLE_KEY: {"S": rid}} for rid in request_ids[start : start + GET_BATCH]
            ]
            while keys_:
                answer = call(
                    self.dynamodb.batch_get_item,
                    RequestItems={
                        table: {
                            "Keys": keys_,
                            "ConsistentRead": True,
                            "ProjectionExpression": "#k, #r, #c",
                            "ExpressionAttributeNames": {
                                "#k": TABLE_KEY,
                                "#r": "result",
                                "#c": CONTENT_ATTRIBUTE,
                            },
                        }
                    },
                )
                for item in answer["Responses"].get(table, []):
                    rid = item[TABLE_KEY]["S"]
                    content = item.get(CONTENT_ATTRIBUTE, {}).get("S")
                    found[rid] = (_parse(rid, item), content)
                keys_ = answer.get("UnprocessedKeys", {}).get(table, {}).get("Keys", [])
        return found

    def cancel(self, result: ExecutionResult, content_sha256: str) -> bool:
        """Record a `cancelled` result (first writer wins: False when a result existed), then
        end its run, wherever it is: flag its claim (a sample in a batch: the worker's next
        renewal fails and its sandbox is killed) and stop its Rollout execution (a request
        run alone: its next heartbeat fails, as does its sandbox)."""
        table = ResultTable(
            self.dynamodb, self.resources.executions_table, self.resources.result_ttl_days
        )
        try:
            written = record(result, table, None, content_sha256=content_sha256)
        except (ClientError, BotoCoreError) as exc:
            raise AwsCallError(f"PutItem (cancel {result.request_id}): {exc}") from exc
        if written and self.resources.admission_table:
            claims = Claims(self.dynamodb, self.resources.admission_table, lease_s=0.0)
            try:  # False: no marker (not admitted yet, or ended): nothing runs for it
                claims.cancel(str(result.request_id))
            except (ClientError, BotoCoreError) as exc:
                raise AwsCallError(f"UpdateItem (cancel {result.request_id}): {exc}") from exc
        if written and self.resources.rollout_arn:
            arn = keys.execution_arn(self.resources.rollout_arn, str(result.request_id))
            try:
                self.sfn.stop_execution(executionArn=arn)
            except ClientError as exc:  # not started yet, or ended: the result stands
                if exc.response["Error"]["Code"] != "ExecutionDoesNotExist":
                    raise AwsCallError(f"StopExecution: {exc}") from exc
        return bool(written)


def _parse(request_id: str, item: dict[str, Any]) -> ExecutionResult | TrialboxError:
    try:
        return ExecutionResult.model_validate_json(item["result"]["S"])
    except (KeyError, ValueError) as exc:  # one unreadable item fails its own request only
        return TrialboxError(f"the stored result of {request_id} cannot be read: {exc}")
