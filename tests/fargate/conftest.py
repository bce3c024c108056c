"""The worker under the task definition's constraints: the image built by its own build script
in a cached bookworm rootfs, run as Fargate runs the `worker` container, against the local
twin. Nothing here skips: a missing tool, rootfs or template fails the suite, saying what."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.fargate.harness import Harness, Service, discard
from tests.fargate.image import Image, build, required_tools
from tests.fargate.taskdef import Container, worker_container
from tests.sandbox.conftest import ADD_TASK
from trialbox.local.template import load_template
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionRequest, ExecutionResult, Status
from trialbox.sdk import Client, Resources

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 90


class WorkerCrashed(AssertionError):
    """A worker container ended other than by recycling."""


@pytest.fixture(scope="session")
def template() -> dict[str, Any]:
    try:
        return load_template()
    except Exception as exc:
        pytest.fail(f"the stack could not be synthesized: {exc}")


@pytest.fixture(scope="session")
def container(template: dict[str, Any]) -> Container:
    return worker_container(template)


@pytest.fixture(scope="session")
def image() -> Image:
    missing = required_tools()
    if missing:
        pytest.fail(f"tests/fargate needs {', '.join(missing)} (`make system` installs the tools)")
    try:
        return build(ROOT)
    except Exception as exc:
        pytest.fail(f"the sandbox image could not be built: {exc}")


@pytest.fixture(scope="session")
def twin() -> Iterator[LocalTwin]:
    with LocalTwin(workers=0) as local:
        yield local


@pytest.fixture(scope="session")
def client(twin: LocalTwin) -> Iterator[Client]:
    session = boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    with Client(
        Resources.from_outputs(twin.outputs), endpoint_url=twin.endpoint_url, session=session
    ) as client:
        yield client


@pytest.fixture(scope="session")
def harness(
    image: Image, container: Container, template: dict[str, Any], twin: LocalTwin
) -> Iterator[Harness]:
    for stale in Path("/var/tmp").glob("trialbox-fargate-*-*"):  # from a session killed outright
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            discard(stale)
    workdir = Path(tempfile.mkdtemp(prefix=f"trialbox-fargate-{os.getpid()}-", dir="/var/tmp"))
    try:
        harness = Harness(image, container, template, twin, workdir)
        yield harness
        harness.clear_kernel_state()
    finally:
        discard(workdir)


@pytest.fixture(scope="session")
def service(harness: Harness) -> Iterator[Service]:
    """The worker exactly as the task definition runs it."""
    running = harness.service()
    try:
        yield running
    finally:
        running.stop()


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
    handles = client.submit(requests)
    deadline = time.monotonic() + timeout
    while True:
        if all(h.done() for h in handles):
            return [h.result() for h in handles]
        crashed = service.failures()
        if crashed:
            raise WorkerCrashed("a worker container crashed:\n" + "\n".join(crashed))
        if time.monotonic() > deadline:
            pytest.fail(
                f"{sum(not h.done() for h in handles)} job(s) had no result after {timeout} s\n"
                + service.logs()
            )
        time.sleep(0.2)


def describe(result: ExecutionResult) -> str:
    return json.dumps(result.model_dump(mode="json"), indent=1)[:6000]


def assert_not_sandbox_error(result: ExecutionResult) -> None:
    assert result.status != Status.SANDBOX_ERROR, describe(result)
