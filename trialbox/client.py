"""The SDK: submit execution requests, wait for typed results.

Config precedence: argument > environment (TRIALBOX_ENDPOINT_URL and friends) > stack outputs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

from trialbox import constants as c
from trialbox import keys
from trialbox.errors import TrialboxError
from trialbox.models import ExecutionRequest, ExecutionResult
from trialbox.stack_version import check_stack_version

if TYPE_CHECKING:
    from trialbox.local.twin import LocalTwin

MAX_INLINE_BYTES = 128 * 1024
# SendMessageBatch's caps: 10 entries, and 256 KiB for all the bodies together.
MAX_BATCH_ENTRIES = 10
MAX_BATCH_BYTES = 256 * 1024
SEND_ATTEMPTS = 3
ENV = {
    "endpoint_url": "TRIALBOX_ENDPOINT_URL",
    "requests_queue_url": "TRIALBOX_REQUESTS_QUEUE_URL",
    "executions_table": "TRIALBOX_EXECUTIONS_TABLE",
    "traces_bucket": "TRIALBOX_TRACES_BUCKET",
    "tasksets_bucket": "TRIALBOX_TASKSETS_BUCKET",
    "capacity": "TRIALBOX_POOL_CAPACITY",  # optional: jobs the pool runs at once
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
REQUIRED = ("requests_queue_url", "executions_table", "traces_bucket", "tasksets_bucket")


class MissingResources(TrialboxError):
    """No stack outputs and no TRIALBOX_* resource names: nothing says where the pipeline is."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"no Trialbox resources given: set {', '.join(missing)}, pass "
            "Resources.from_outputs(stack outputs), or use Client.local()"
        )


class AwsCallError(TrialboxError):
    """AWS refused a call; the message names the call and the reason."""


class WaitTimeout(TrialboxError):
    def __init__(self, missing: list[str], timeout_s: float) -> None:
        self.missing = missing
        super().__init__(
            f"{len(missing)} request(s) had no terminal result after {timeout_s:g} s "
            f"(first: {', '.join(missing[:5])})"
        )


@dataclass(frozen=True)
class Resources:
    requests_queue_url: str
    executions_table: str
    traces_bucket: str
    tasksets_bucket: str
    capacity: int | None = None  # the pool's jobs at once, when the stack says

    @classmethod
    def from_outputs(cls, outputs: dict[str, str]) -> Resources:
        needed = [c.OUTPUT_REQUESTS_QUEUE_URL, c.OUTPUT_EXECUTIONS_TABLE]
        needed += [c.OUTPUT_TRACES_BUCKET, c.OUTPUT_TASKSETS_BUCKET]
        missing = [name for name in needed if name not in outputs]
        if missing:
            raise TrialboxError(
                f"not a Trialbox stack: its outputs lack {', '.join(missing)} "
                "(deploy this version's stack, or pass the resource names)"
            )
        return cls(
            requests_queue_url=outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
            executions_table=outputs[c.OUTPUT_EXECUTIONS_TABLE],
            traces_bucket=outputs[c.OUTPUT_TRACES_BUCKET],
            tasksets_bucket=outputs[c.OUTPUT_TASKSETS_BUCKET],
            capacity=_capacity(outputs.get(c.OUTPUT_POOL_CAPACITY), c.OUTPUT_POOL_CAPACITY),
        )


class Client:
    def __init__(
        self,
        resources: Resources | None = None,
        *,
        endpoint_url: str | None = None,
        session: Any = None,
        twin: LocalTwin | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url or os.environ.get(ENV["endpoint_url"])
        if resources is None:
            values = {k: os.environ.get(ENV[k]) for k in REQUIRED}
            missing = [ENV[k] for k, v in values.items() if not v]
            if missing:
                raise MissingResources(missing)
            resources = Resources(
                **values,  # type: ignore[arg-type]
                capacity=_capacity(os.environ.get(ENV["capacity"]), ENV["capacity"]),
            )
        self.resources = resources
        session = session or boto3.session.Session()
        self._clients = {
            name: _service(session, name, self.endpoint_url) for name in ("sqs", "dynamodb", "s3")
        }
        self._twin = twin

    @classmethod
    def from_stack(cls, stack_name: str, *, session: Any = None) -> Client:
        """The resources of a deployed stack, read from its CloudFormation outputs."""
        session = session or boto3.session.Session()
        cfn = _service(session, "cloudformation", None)
        try:
            described = cfn.describe_stacks(StackName=stack_name)
        except (ClientError, BotoCoreError) as exc:
            raise AwsCallError(
                f"cannot read stack {stack_name!r} in {session.region_name}: {exc}"
            ) from exc
        stack = described["Stacks"][0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        resources = Resources.from_outputs(outputs)
        check_stack_version(stack_name, outputs)
        return cls(resources, session=session)

    @property
    def capacity(self) -> int | None:
        """Jobs the pool runs at once, when known: the twin's workers, or the stack's pool."""
        return self._twin.workers if self._twin is not None else self.resources.capacity

    @property
    def is_local(self) -> bool:
        """A local twin (in-process, or `trialbox local up` on this machine), whose S3 and
        table end when it stops."""
        host = urlparse(self.endpoint_url or "").hostname
        return self._twin is not None or host in LOOPBACK

    @classmethod
    def local(cls, workers: int = 2) -> Client:
        """An in-process local twin; closed with the client."""
        from trialbox.local.twin import LocalTwin

        twin = LocalTwin(workers=workers).start()
        session = boto3.session.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
        )
        return cls(
            Resources.from_outputs(twin.outputs),
            endpoint_url=twin.endpoint_url,
            session=session,
            twin=twin,
        )

    def push_taskset(self, key: str, body: bytes) -> None:
        """Upload a task set file; requests refer to it by `taskset@version/task_id`."""
        self._call(
            self._clients["s3"].put_object,
            Bucket=self.resources.tasksets_bucket,
            Key=key,
            Body=body,
        )

    def submit(self, requests: list[ExecutionRequest]) -> list[str]:
        """SendMessageBatch; payloads over 128 KiB go to S3 first, and each batch stays within
        SQS's 10 entries and 256 KiB in all. Entries SQS fails on its side are sent again."""
        bodies = [(r.request_id, self._message_body(r)) for r in requests]
        sent = 0
        for batch in _batches(bodies):
            refused = self._send_batch(batch)
            if refused:
                later = len(bodies) - sent - len(batch)
                reason = next(iter(refused.values()))
                raise AwsCallError(
                    f"SendMessageBatch refused {', '.join(refused)} ({reason}); "
                    f"{sent + len(batch) - len(refused)} other request(s) were sent and the "
                    f"{later} after them were not. Submitting the same request ids again "
                    "runs each at most once."
                )
            sent += len(batch)
        return [r.request_id for r in requests]

    def _message_body(self, request: ExecutionRequest) -> str:
        body = request.model_dump_json(exclude_defaults=True)
        if len(body.encode()) <= MAX_INLINE_BYTES:
            return body
        key = f"{keys.PAYLOADS_PREFIX}{request.request_id}.json"
        self._call(
            self._clients["s3"].put_object, Bucket=self.resources.traces_bucket, Key=key, Body=body
        )
        uri = f"s3://{self.resources.traces_bucket}/{key}"
        return json.dumps({"request_id": request.request_id, "payload_uri": uri})

    def _send_batch(self, batch: list[tuple[str, str]]) -> dict[str, str]:
        """Send one batch; resend what SQS failed on its side. Returns the request ids it
        refused for good, with SQS's reason (empty when all were sent)."""
        pending = dict(enumerate(batch))
        for attempt in range(SEND_ATTEMPTS):
            entries = [{"Id": str(i), "MessageBody": body} for i, (_, body) in pending.items()]
            answer = self._call(
                self._clients["sqs"].send_message_batch,
                QueueUrl=self.resources.requests_queue_url,
                Entries=entries,
            )
            failed = answer.get("Failed", [])
            if any(f.get("SenderFault") for f in failed) or (
                failed and attempt == SEND_ATTEMPTS - 1
            ):
                return {
                    pending[int(f["Id"])][0]: f"{f.get('Code')}: {f.get('Message')}" for f in failed
                }
            pending = {int(f["Id"]): pending[int(f["Id"])] for f in failed}
            if not pending:
                return {}
            time.sleep(0.1 * 2**attempt)
        return {}

    def poll(self, request_ids: list[str]) -> dict[str, ExecutionResult]:
        """The terminal results that exist now (BatchGetItem, 100 keys at a time)."""
        found: dict[str, ExecutionResult] = {}
        table = self.resources.executions_table
        for start in range(0, len(request_ids), 100):
            keys: list[dict[str, Any]] = [
                {c.TABLE_KEY: {"S": rid}} for rid in request_ids[start : start + 100]
            ]
            while keys:
                answer = self._call(
                    self._clients["dynamodb"].batch_get_item,
                    RequestItems={table: {"Keys": keys, "ConsistentRead": True}},
                )
                for item in answer["Responses"].get(table, []):
                    result = ExecutionResult.model_validate_json(item["result"]["S"])
                    found[item[c.TABLE_KEY]["S"]] = result
                keys = answer.get("UnprocessedKeys", {}).get(table, {}).get("Keys", [])
        return found

    def wait(
        self, request_ids: list[str], timeout: float = 600, delay: float = 0.2, max_delay: float = 5
    ) -> list[ExecutionResult]:
        """Poll with backoff until every id has a result; raises WaitTimeout (with the ids)."""
        deadline = time.monotonic() + timeout
        results: dict[str, ExecutionResult] = {}
        while True:
            pending = [rid for rid in request_ids if rid not in results]
            results.update(self.poll(pending))
            pending = [rid for rid in request_ids if rid not in results]
            if not pending:
                return [results[rid] for rid in request_ids]
            if time.monotonic() >= deadline:
                raise WaitTimeout(pending, timeout)
            time.sleep(delay)
            delay = min(max_delay, delay * 1.5)

    def read_object(self, uri: str) -> bytes:
        """An `s3://bucket/key` object: a trace or a report."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not key:
            raise TrialboxError(f"not an s3://bucket/key URI: {uri!r}")
        answer = self._call(self._clients["s3"].get_object, Bucket=bucket, Key=key)
        return bytes(answer["Body"].read())

    def run(
        self,
        requests: list[ExecutionRequest],
        timeout: float = 600,
        concurrency: int | None = None,
    ) -> list[ExecutionResult]:
        """Every request to its terminal result, in order. At most `concurrency` are in flight
        (default: `default_concurrency(self.capacity)`), the next submitted as each result
        arrives: a queue deeper than the pool drains within its heartbeat would look like lost
        sandboxes. Raises WaitTimeout (with the ids) when `timeout` passes first."""
        from trialbox.driver import Driver, default_concurrency

        results: dict[str, ExecutionResult] = {}
        driver = Driver(
            self,
            requests,
            concurrency=concurrency or default_concurrency(self.capacity),
            on_result=lambda rid, result, _: results.__setitem__(rid, result),
        )
        driver.collect_recorded()
        driver.run(timeout)
        missing = [r.request_id for r in requests if r.request_id not in results]
        if missing:
            raise WaitTimeout(missing, timeout)
        return [results[r.request_id] for r in requests]

    @staticmethod
    def _call(method: Any, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise AwsCallError(f"{method.__name__}: {exc}") from exc

    def close(self) -> None:
        if self._twin is not None:
            self._twin.stop()
            self._twin = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


def _service(session: Any, name: str, endpoint_url: str | None) -> Any:
    try:
        return session.client(name, endpoint_url=endpoint_url)
    except NoRegionError as exc:
        raise TrialboxError(
            "no AWS region configured: set AWS_REGION (or AWS_DEFAULT_REGION) to the region "
            "the stack is deployed in"
        ) from exc


def _batches(bodies: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """Consecutive runs of (request id, message body) that fit one SendMessageBatch call."""
    batch: list[tuple[str, str]] = []
    size = 0
    for request_id, body in bodies:
        length = len(body.encode())
        if batch and (len(batch) == MAX_BATCH_ENTRIES or size + length > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((request_id, body))
        size += length
    if batch:
        yield batch


def _capacity(value: str | None, name: str) -> int | None:
    if not value:
        return None
    try:
        capacity = int(value)
    except ValueError:
        capacity = 0
    if capacity < 1:
        raise TrialboxError(f"{name} must be a positive number of workers, got {value!r}")
    return capacity
