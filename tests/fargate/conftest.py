"""The worker under the task definition's constraints: the image built by its own build script
in a cached bookworm rootfs, run as Fargate runs the `worker` container, against the local
twin. Nothing here skips: a missing tool, rootfs or template fails the suite, saying what."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.fargate.harness import Harness, Service, discard
from tests.fargate.image import Image, build, required_tools
from tests.fargate.taskdef import Container, worker_container
from trialbox.local.template import load_template
from trialbox.local.twin import LocalTwin
from trialbox.sdk import Client, Resources

ROOT = Path(__file__).resolve().parents[2]
# Whichever test of the package runs first builds the image (debootstrap and the locked pip
# installs: minutes on a new machine), and the grading-integrity runs put the red-team corpus
# and 164 HumanEval jobs through the pipeline; the suite's 300 s is too short for those.
TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S))


@pytest.fixture(scope="package")
def template() -> dict[str, Any]:
    try:
        return load_template()
    except Exception as exc:
        pytest.fail(f"the stack could not be synthesized: {exc}")


@pytest.fixture(scope="package")
def container(template: dict[str, Any]) -> Container:
    return worker_container(template)


@pytest.fixture(scope="package")
def image() -> Image:
    missing = required_tools()
    if missing:
        pytest.fail(f"tests/fargate needs {', '.join(missing)} (`make system` installs the tools)")
    try:
        return build(ROOT)
    except Exception as exc:
        pytest.fail(f"the sandbox image could not be built: {exc}")


@pytest.fixture(scope="package")
def twin() -> Iterator[LocalTwin]:
    with LocalTwin(workers=0) as local:
        yield local


@pytest.fixture(scope="package")
def client(twin: LocalTwin) -> Iterator[Client]:
    session = boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    with Client(
        Resources.from_outputs(twin.outputs), endpoint_url=twin.endpoint_url, session=session
    ) as client:
        yield client


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
def service(harness: Harness) -> Iterator[Service]:
    """The worker exactly as the task definition runs it. A test's own service
    (harness.service) pauses it; run_jobs runs it again (Harness.activate)."""
    running = harness.service()
    try:
        yield running
    finally:
        running.stop()
