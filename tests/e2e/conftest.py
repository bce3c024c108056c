"""The local twin end to end, with real bwrap sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.sandbox.conftest import ADD_TASK
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionRequest
from trialbox.sdk import Client


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client.local(workers=2) as local:
        yield local


def request(request_id: str, solution: str, **changes: Any) -> ExecutionRequest:
    body = {"request_id": request_id, "task": ADD_TASK, "files": {"solution.py": solution}}
    return ExecutionRequest.model_validate(body | changes)


def twin_of(client: Client) -> LocalTwin:
    """The local twin behind the module's client."""
    twin = client.aio._twin
    assert twin is not None
    return twin
