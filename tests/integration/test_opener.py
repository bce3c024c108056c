"""A worker's reader of the open queue (trialbox.worker.opener), under moto: it takes no more
opens than its room, says `opened` to each in batches, and gives back at once (never loses)
what it cannot host: under rlimit an open taken while a job started, every open in hand when
told to stop, and the opens of a worker whose inbox cannot be made."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK
from trialbox.models import Task
from trialbox.models.sessions import Reply, SessionOpen, SessionSpec
from trialbox.sandbox.config import ENV_PREFIX
from trialbox.sandbox.runner import Runner
from trialbox.worker.opener import Opener
from trialbox.worker.sessions import SessionHost


@pytest.fixture
def host(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Iterator[SessionHost]:
    monkeypatch.setenv(f"{ENV_PREFIX}SLOTS", "4")  # room for 3 sessions: a slot stays for jobs
    made = SessionHost(Runner(), aws.sqs, aws.traces, "w-1", queue_prefix="t-s-")

    def ensure() -> str:  # the inbox, without its reader (whose long poll holds moto's lock)
        made.inbox.url = made.inbox.url or aws.sqs.create_queue(QueueName="inbox")["QueueUrl"]
        return made.inbox.url

    monkeypatch.setattr(made.inbox, "ensure", ensure)
    yield made
    made.stop()


@pytest.fixture
def opens(aws: Aws) -> str:
    return str(aws.sqs.create_queue(QueueName="opens")["QueueUrl"])


def opener(aws: Aws, opens: str, host: SessionHost) -> Opener:
    return Opener(aws.sqs, opens, host, threading.Event(), wait_s=0, on_hosted=threading.Event())


def send_opens(aws: Aws, opens: str, reply_url: str, n: int, fill: str = "a") -> list[str]:
    ids = [f"s{k:02d}" + fill * 29 for k in range(n)]
    for session_id in ids:
        spec = SessionSpec(
            session_id=session_id,
            task_id="add",
            limits=Task.model_validate(ADD_TASK).limits,
            expires_at=time.time() + 60,
            idle_release_s=30,
            reply_url=reply_url,
        )
        body = SessionOpen(session=spec).model_dump_json()
        aws.sqs.send_message(QueueUrl=opens, MessageBody=body)
    return ids


def waiting(aws: Aws, queue: str) -> list[str]:
    """The queue's visible messages' bodies (each then invisible for 30 s)."""
    bodies: list[str] = []
    while batch := aws.sqs.receive_message(
        QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=30
    ).get("Messages", []):
        bodies += [m["Body"] for m in batch]
    return bodies


def peek(aws: Aws, queue: str) -> list[str]:
    """The visible messages' bodies (up to 10), left visible."""
    answer = aws.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    return [m["Body"] for m in answer.get("Messages", [])]


def test_a_worker_takes_no_more_opens_than_its_room_and_says_opened_to_each(
    aws: Aws, opens: str, host: SessionHost
) -> None:
    replies = aws.sqs.create_queue(QueueName="replies")["QueueUrl"]
    ids = send_opens(aws, opens, replies, 5)
    assert opener(aws, opens, host).poll_once()
    assert host.held() == 3 and host.room() == 0
    said = [Reply.model_validate_json(body) for body in waiting(aws, replies)]
    hosted = sorted(r.session_id for r in said)
    assert len(hosted) == 3 and set(hosted) <= set(ids)
    assert {(r.kind, r.inbox_url) for r in said} == {("opened", host.inbox.url)}
    left = [SessionOpen.model_validate_json(b).session.session_id for b in waiting(aws, opens)]
    assert sorted(left + hosted) == ids  # the other two wait for another worker
    assert not opener(aws, opens, host).poll_once()  # no room: the queue is not read


def test_under_rlimit_an_open_taken_while_a_job_started_goes_back_at_once(
    aws: Aws, opens: str, host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.exclusive = True
    replies = aws.sqs.create_queue(QueueName="replies")["QueueUrl"]
    (session_id,) = send_opens(aws, opens, replies, 1)
    reader = opener(aws, opens, host)
    with host.job() as seated:
        assert seated and host.room() == 0
        monkeypatch.setattr(host, "room", lambda: 1)  # read just before the job started
        assert reader.poll_once()
        assert host.held() == 0
        assert waiting(aws, replies) == []
        (back,) = peek(aws, opens)  # visible again at once, for another task
    assert SessionOpen.model_validate_json(back).session.session_id == session_id
    monkeypatch.undo()
    # And the other way round: a job taken while the task hosts a session goes back.
    assert reader.poll_once() and host.held() == 1 and reader.on_hosted.is_set()
    with host.job() as seated:
        assert not seated


def test_opens_in_hand_go_back_when_the_worker_stops_or_cannot_make_its_inbox(
    aws: Aws, opens: str, host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = aws.sqs.create_queue(QueueName="replies")["QueueUrl"]
    ids = send_opens(aws, opens, replies, 2)
    stopping = opener(aws, opens, host)
    stopping.stop.set()  # as if SIGTERM came during the long poll
    assert stopping.poll_once()
    assert host.held() == 0 and len(peek(aws, opens)) == 2

    def refused() -> str:
        raise RuntimeError("CreateQueue: throttled")

    monkeypatch.setattr(host.inbox, "ensure", refused)
    with pytest.raises(RuntimeError, match="throttled"):
        opener(aws, opens, host).poll_once()
    assert host.held() == 0
    back = [SessionOpen.model_validate_json(b).session.session_id for b in peek(aws, opens)]
    assert sorted(back) == ids  # none lost: another worker (or this one, later) hosts them


def test_a_message_that_is_not_an_open_is_dropped_and_the_opens_beside_it_are_hosted(
    aws: Aws, opens: str, host: SessionHost, caplog: pytest.LogCaptureFixture
) -> None:
    replies = aws.sqs.create_queue(QueueName="replies")["QueueUrl"]
    aws.sqs.send_message(QueueUrl=opens, MessageBody=json.dumps({"neither": 1}))
    (session_id,) = send_opens(aws, opens, replies, 1)
    reader = opener(aws, opens, host)
    while peek(aws, opens):
        reader.poll_once()
    assert host.held() == 1
    assert [Reply.model_validate_json(b).session_id for b in waiting(aws, replies)] == [session_id]
    assert "not an open" in caplog.text


def test_opens_admitted_before_a_failed_delete_are_still_hosted_and_redelivered_once(
    aws: Aws, opens: str, host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break (red team): a DeleteMessageBatch that failed after admit left the session
    registered with no thread, so its slot was held for good (under rlimit, the task refused
    every job) and its redelivered open was taken as a duplicate and never answered."""
    replies = aws.sqs.create_queue(QueueName="replies")["QueueUrl"]
    (session_id,) = send_opens(aws, opens, replies, 1, fill="d")  # its thread's name: its own
    real = aws.sqs.delete_message_batch

    def throttled(**kwargs: object) -> None:
        raise RuntimeError("DeleteMessageBatch: throttled")

    monkeypatch.setattr(aws.sqs, "delete_message_batch", throttled)
    with pytest.raises(RuntimeError, match="throttled"):
        opener(aws, opens, host).poll_once()
    monkeypatch.setattr(aws.sqs, "delete_message_batch", real)
    said = [Reply.model_validate_json(b) for b in waiting(aws, replies)]
    assert [(r.kind, r.session_id) for r in said] == [("opened", session_id)]
    assert [t.name for t in threading.enumerate() if t.name == session_id] == [session_id]
