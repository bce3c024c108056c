"""Red team of the sessions' shared transport (one inbox per worker, one reply queue per
client, each message naming its session; epochs; the idle release under rlimit). Each test
is a break found in it: it failed on the code before its fix (or is xfail(strict=True) while
the fix is not in), for the reason its docstring gives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import LOST_WORKER_HEARTBEAT_S, request, twin_and_client
from trialbox.local.twin import LocalTwin
from trialbox.models import Status, Task
from trialbox.models.report import CommandResult
from trialbox.models.sessions import Call
from trialbox.sandbox.config import ENV_PREFIX
from trialbox.sdk import Client, Resources
from trialbox.sdk.core import local_session

TASK = Task.model_validate(ADD_TASK)
NOISE = [["sh", "-c", "head -c 3000000 /dev/urandom > noise"]]  # ~3 MB stored a call


@pytest.fixture(scope="module")
def killable() -> Iterator[tuple[LocalTwin, Client]]:
    with twin_and_client(workers=1, heartbeat_s=LOST_WORKER_HEARTBEAT_S) as both:
        yield both


def test_a_failover_does_not_give_the_session_a_fresh_checkpoint_quota(
    killable: tuple[LocalTwin, Client],
) -> None:
    """The checkpoint quota (4 x disk_mb over the session's life, 16 MiB here) was counted in
    the host's memory and reached the next host only through an idle `released` reply: a
    failover (a lost worker, or a worker stopped after an idle release, whose `released` the
    client never reads once the inbox is gone) reopened the session with `stored_bytes=0`,
    so every lost worker gave the session a fresh 16 MiB. Every result now says the bytes
    stored so far, and a reopen carries them on."""
    twin, client = killable
    assert twin.pool is not None
    with client.session(TASK, ttl_s=600, limits={"disk_mb": 4, "memory_mb": 256}) as s:
        for _ in range(5):  # 15 MB stored: one more would pass 16 MiB
            kept = s.step(commands=NOISE)
            assert (kept.status, kept.error) == (Status.SUCCEEDED, None), kept
        twin.pool.kill()  # the host is lost while the session is idle
        after = s.exec(["true"])  # silence, a failover, the call sent again
        assert s.failovers == 1 and getattr(after, "exit_code", None) == 0, after
        refused = s.step(commands=NOISE)
        assert refused.status == Status.SUCCEEDED
        assert refused.error is not None and "checkpoint storage" in refused.error, refused


def test_a_call_from_another_client_naming_a_session_does_not_run_in_it(
    killable: tuple[LocalTwin, Client],
) -> None:
    """A worker's inbox carries every hosted session's calls, and the host ran any call that
    named the session, whichever client sent it (its `reply_url` another client's): a
    trainer's bug (a session id from a shared log, a stale copy) ran its command in another
    trainer's session and advanced its seq, so that session's own next call was answered with
    the stray call's recorded result and never ran. A host now runs only calls that name the
    reply queue the session was opened with."""
    twin, client = killable
    with (
        Client(
            Resources.from_outputs(twin.outputs),
            endpoint_url=twin.endpoint_url,
            session=local_session(),
        ) as other,
        other.session(TASK, ttl_s=600) as victim,
        client.session(TASK, ttl_s=600) as own,
    ):
        own.exec(["true"])  # this client's reply queue exists
        assert own.aio._reply_url != victim.aio._reply_url
        stray = Call(
            session_id=victim.session_id, reply_url=own.aio._reply_url, seq=victim.aio.seq + 1,
            epoch=victim.aio.epoch, op="exec", commands=[["sh", "-c", "echo stray > stray.txt"]],
        )  # fmt: skip
        twin.client("sqs").send_message(
            QueueUrl=victim.aio._inbox, MessageBody=stray.model_dump_json()
        )
        time.sleep(2)  # the stray call reached the host first
        mine = victim.exec(["sh", "-c", "cat stray.txt 2>/dev/null; echo mine"])
        assert isinstance(mine, CommandResult) and mine.stdout == "mine\n", mine


@pytest.fixture(scope="module")
def exclusive() -> Iterator[tuple[LocalTwin, Client]]:
    """One worker on the rlimit backend (Fargate's): a task hosts one session and nothing
    else meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"{ENV_PREFIX}BACKEND", "rlimit")
        patch.setenv(f"{ENV_PREFIX}SLOTS", "1")
        with twin_and_client(workers=1) as both:
            yield both


def test_a_fresh_session_never_called_frees_the_rlimit_task_when_idle(
    exclusive: tuple[LocalTwin, Client],
) -> None:
    """A fresh open makes its workspace at its first call, and the idle release waited for
    a workspace: under rlimit a session opened and not yet called (or whose workspace a
    refused call dropped) held the pool's task, taking no job and no other session, until its
    TTL (up to 24 h) instead of `idle_release_s`. An idle session is now released under
    rlimit whether or not it has a workspace."""
    _, client = exclusive
    with client.session(TASK, ttl_s=600, idle_release_s=1) as s:
        time.sleep(3)  # idle past idle_release_s: the task should be free for the job
        (handle,) = client.submit([request("rt-fresh-idle", CORRECT)])
        assert handle.result(timeout=90).reward == 1.0
        assert s.exec(["cat", "solution.py"]).exit_code == 0  # reopened on its next call


def test_closing_a_client_whose_sessions_lost_their_worker_takes_one_failover_not_one_each(
    killable: tuple[LocalTwin, Client],
) -> None:
    """A client closes its open sessions with itself, and each close call to a lost worker's
    inbox waits FAILOVER_S of silence: they were closed one after another, so a trainer
    ending with 6 sessions on a lost worker took 6 x 5 s to close (256 sessions: 21 minutes).
    They are now closed together."""
    twin, _ = killable
    assert twin.pool is not None
    other = Client(
        Resources.from_outputs(twin.outputs),
        endpoint_url=twin.endpoint_url,
        session=local_session(),
    )
    try:
        sessions = [other.session(TASK, ttl_s=600) for _ in range(6)]
        for s in sessions:
            assert s.exec(["true"]).exit_code == 0  # type: ignore[union-attr]
        twin.pool.kill()  # their host is lost; its inbox stays (SIGKILL deletes nothing)
    finally:
        started = time.monotonic()
        other.close()
        took = time.monotonic() - started
    assert took < 15, f"closing took {took:.1f} s"
    assert all(s.closed for s in sessions)
