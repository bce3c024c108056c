"""The local twin in tests: a request for the add task, the twin behind a client, and the
processes a twin started."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.support.tasks import ADD_TASK
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionRequest
from trialbox.sdk import Client, Resources
from trialbox.sdk.core import local_session

# A twin whose workers are killed under a session: the heartbeat bounds how long a message stays
# hidden after a dead worker's long poll took it (3 heartbeats, trialbox.settings), which SQS
# and moto both allow. At the default 60 s that is 180 s of waiting for a failover's reopen.
LOST_WORKER_HEARTBEAT_S = 5


def request(request_id: str, solution: str, **changes: Any) -> ExecutionRequest:
    body = {"request_id": request_id, "task": ADD_TASK, "files": {"solution.py": solution}}
    return ExecutionRequest.model_validate(body | changes)


def twin_of(client: Client) -> LocalTwin:
    """The local twin behind the module's client."""
    twin = client.aio._twin
    assert twin is not None
    return twin


def client_of(twin: LocalTwin, concurrency: int) -> Client:
    """Another client of `twin` (its own boto3 session), with this window."""
    resources = Resources.from_outputs(twin.outputs)
    return Client(
        resources, endpoint_url=twin.endpoint_url, session=local_session(), concurrency=concurrency
    )


@contextlib.contextmanager
def twin_and_client(**twin: Any) -> Iterator[tuple[LocalTwin, Client]]:
    """A twin built with `twin`'s arguments (Client.local takes only a worker count), and a
    client of it; both stopped at the end."""
    with LocalTwin(**twin) as local:
        resources = Resources.from_outputs(local.outputs)
        with Client(resources, endpoint_url=local.endpoint_url, session=local_session()) as client:
            yield local, client
