"""Sessions make no queue of their own (issue 24): a worker's one inbox carries the calls of
every session it hosts, a client's one reply queue the replies to all its sessions. 256
sessions opened at once on a twin with room make no CreateQueue call each (read from the
twin's request log), and the queues the reaper reads are the workers' and the client's."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import request, twin_and_client
from trialbox import constants as c
from trialbox.local import principals
from trialbox.local.requestlog import ENV_REQUEST_LOG, calls
from trialbox.local.twin import LocalTwin
from trialbox.models import Status, Task
from trialbox.sandbox.config import ENV_PREFIX
from trialbox.sdk import Client

SESSIONS = 256
CALLS = 16  # of them make a call, each through a worker's shared inbox
WORKERS = 4
TASK = Task.model_validate(ADD_TASK)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalTwin, Client, Path]]:
    """A twin with a slot for every session (a worker keeps one for jobs), its requests
    logged."""
    log = tmp_path_factory.mktemp("requests") / "requests.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_REQUEST_LOG, str(log))
        patch.setenv(f"{ENV_PREFIX}SLOTS", str(SESSIONS + 2 * WORKERS))
        with twin_and_client(workers=WORKERS) as (twin, client):
            yield twin, client, log


IDLE_S = 5


def test_an_idle_twin_s_event_sources_long_poll(logged: tuple[LocalTwin, Client, Path]) -> None:
    """Lambda long-polls a mapping's queue (20 s, SQS's longest wait): an idle stack's event
    sources cost a call per 20 s a poller, not one a second. Read from the request log: over
    an idle window each function's pollers (at most two here) end at most one wait each, and
    the receive that then brings a request waited with WaitTimeSeconds 20."""
    _, client, log = logged
    before = len(calls(log))
    time.sleep(IDLE_S)
    idle = Counter(
        call.key
        for call in calls(log)[before:]
        if call.operation == "ReceiveMessage" and call.key.startswith(principals.FUNCTION_PREFIX)
    )
    assert max(idle.values(), default=0) <= 2, idle
    [result] = client.run([request("idle-then-one", CORRECT)], timeout=120)
    assert result.reward == 1.0, result
    dispatcher = principals.function("Dispatcher")
    received = [
        call
        for call in calls(log)
        if call.operation == "ReceiveMessage" and call.key.startswith(dispatcher)
    ]
    assert received and {int(call.params["WaitTimeSeconds"]) for call in received} == {20}


def test_sessions_opened_at_once_make_no_queue_of_their_own(
    logged: tuple[LocalTwin, Client, Path],
) -> None:
    twin, client, log = logged
    before = len(calls(log))

    all_open = threading.Barrier(SESSIONS)

    def episode(n: int) -> tuple[str, Status]:
        with client.session(TASK, ttl_s=600) as s:
            all_open.wait()
            if n % (SESSIONS // CALLS):  # a first call makes a workspace: the machine's CPU
                return s.session_id, Status.SUCCEEDED
            result = s.step(files={"n.txt": str(n)}, commands=[["cat", "n.txt"]])
            assert result.commands[0].stdout == str(n), result  # its own session's answer
            return s.session_id, result.status

    with ThreadPoolExecutor(SESSIONS) as pool:
        ended = list(pool.map(episode, range(SESSIONS)))
    assert len({session_id for session_id, _ in ended}) == SESSIONS
    assert {status for _, status in ended} == {Status.SUCCEEDED}
    made = Counter(
        call.key for call in calls(log)[before:] if call.operation in ("CreateQueue", "DeleteQueue")
    )
    # One reply queue for the client, at most one inbox a worker: never one per session.
    created = [call for call in calls(log)[before:] if call.operation == "CreateQueue"]
    assert 1 <= len(created) <= 1 + WORKERS, made
    assert not [call for call in calls(log)[before:] if call.operation == "DeleteQueue"], made
    prefix = twin.output(c.OUTPUT_SESSION_QUEUE_PREFIX)
    queues = twin.client("sqs").list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    assert len(queues) <= 1 + WORKERS  # what the reaper reads each minute
