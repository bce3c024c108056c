"""Jobs for the worker under test: a request, a program, and the results of a batch, failing at
once with the workers' logs when a worker container crashes."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.fargate.harness import Service
from tests.support.tasks import ADD_TASK
from trialbox import constants as c
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task
from trialbox.pipeline.admission import Admission
from trialbox.sdk import Client

JOB_TIMEOUT_S = 90


class WorkerCrashed(AssertionError):
    """A worker container ended other than by recycling."""


def request(
    files: dict[str, str] | None = None,
    commands: list[list[str]] | None = None,
    grade: bool = False,
    **limits: Any,
) -> ExecutionRequest:
    body: dict[str, Any] = {
        "request_id": f"fg-{uuid.uuid4().hex[:12]}",
        "task": ADD_TASK,
        "files": files or {},
        "commands": commands or [],
        "grade": grade,
    }
    if limits:
        body["limits"] = limits
    return ExecutionRequest.model_validate(body)


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def run_jobs(
    client: Client,
    service: Service,
    requests: list[ExecutionRequest],
    timeout: float = JOB_TIMEOUT_S,
) -> list[ExecutionResult]:
    """Submit, wait for every terminal result; fail at once, with the workers' logs, when a
    worker container crashes instead."""
    service.harness.activate(service)
    handles = client.submit(requests)
    deadline = time.monotonic() + timeout
    while True:
        if all(h.done() for h in handles):
            return [h.result() for h in handles]
        crashed = service.failures()
        if crashed:
            raise WorkerCrashed("a worker container crashed:\n" + "\n".join(crashed))
        if time.monotonic() > deadline:
            pending = [h.request_id for h in handles if not h.done()]
            pytest.fail(
                f"{len(pending)} job(s) had no result after {timeout} s\n"
                + pipeline_state(service, pending)
                + service.logs()
            )
        time.sleep(0.2)


def pipeline_state(service: Service, pending: list[str]) -> str:
    """Where unfinished jobs are: the pool's admission (live slots, the in-flight count, the
    markers) and the queues' depths, for a timeout's message."""
    twin = service.harness.twin
    outputs = twin.outputs
    admission = Admission(twin.client("dynamodb"), outputs[c.OUTPUT_ADMISSION_TABLE])
    sqs = twin.client("sqs")
    depths = {
        name: sqs.get_queue_attributes(QueueUrl=outputs[key], AttributeNames=["All"])["Attributes"]
        for name, key in (
            ("requests", c.OUTPUT_REQUESTS_QUEUE_URL),
            ("work", c.OUTPUT_WORK_QUEUE_URL),
        )
    }
    counts = {
        name: {k: v for k, v in attrs.items() if k.startswith("ApproximateNumberOfMessages")}
        for name, attrs in depths.items()
    }
    markers = admission.admitted()
    return (
        f"admission: {admission.capacity()} live slot(s), {admission.in_flight()} in flight, "
        f"markers {json.dumps({k: str(v) for k, v in markers.items()})[:2000]}\n"
        f"pending {pending[:5]}, queues {json.dumps(counts)}\n"
    )


def run_in_window(
    client: Client,
    service: Service,
    requests: list[ExecutionRequest],
    in_flight: int,
    timeout: float,
) -> list[ExecutionResult]:
    """`requests` in order, at most `in_flight` submitted and unfinished at a time: the next
    job is queued while one runs, so the worker never idles, and none waits in the queue
    longer than the jobs ahead of it (a job queued past the Execute step's heartbeat fails,
    as on AWS). `timeout` bounds each job from its submission. Fails at once, with the
    workers' logs, when a worker container crashes."""
    service.harness.activate(service)
    results: dict[int, ExecutionResult] = {}
    running: dict[int, tuple[Any, float]] = {}  # index: (handle, its deadline)
    queued = iter(enumerate(requests))
    while len(results) < len(requests):
        while len(running) < in_flight:
            nxt = next(queued, None)
            if nxt is None:
                break
            [handle] = client.submit([nxt[1]])
            running[nxt[0]] = (handle, time.monotonic() + timeout)
        for index, (handle, deadline) in list(running.items()):
            if handle.done():
                results[index] = handle.result()
                del running[index]
            elif time.monotonic() > deadline:
                pytest.fail(
                    f"job {index} ({requests[index].request_id}) had no result after "
                    f"{timeout} s\n" + service.logs()
                )
        crashed = service.failures()
        if crashed:
            raise WorkerCrashed("a worker container crashed:\n" + "\n".join(crashed))
        time.sleep(0.1)
    return [results[i] for i in range(len(requests))]


def describe(result: ExecutionResult) -> str:
    return json.dumps(result.model_dump(mode="json"), indent=1)[:6000]


def assert_not_sandbox_error(result: ExecutionResult) -> None:
    assert result.status != Status.SANDBOX_ERROR, describe(result)


def graded_job(task: Task, files: dict[str, Any], commands: list[list[str]]) -> ExecutionRequest:
    """A graded job of the task with these files and commands."""
    return ExecutionRequest.model_validate(
        {
            "request_id": f"fg-{uuid.uuid4().hex[:12]}",
            "task": task.model_dump(mode="json", exclude_none=True),
            "files": files,
            "commands": commands,
            "grade": True,
        }
    )
