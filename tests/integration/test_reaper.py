"""The reaper deletes the queues of sessions past their TTL, and nothing else."""

from __future__ import annotations

import time

from tests.support.moto import Aws
from trialbox.models.sessions import MAX_TTL_S, TAG_EXPIRES
from trialbox.pipeline.reaper import GRACE_S, reap

PREFIX = "Trialbox-s-"


def _queue(aws: Aws, name: str, expires_at: float | None) -> str:
    tags = {} if expires_at is None else {TAG_EXPIRES: str(int(expires_at))}
    return str(aws.sqs.create_queue(QueueName=name, tags=tags)["QueueUrl"])


def test_only_queues_of_sessions_past_their_ttl_go(aws: Aws) -> None:
    now = time.time()
    expired = [_queue(aws, f"{PREFIX}old-{end}", now - GRACE_S - 5) for end in ("in", "out")]
    live = _queue(aws, f"{PREFIX}live-in", now + 600)
    in_grace = _queue(aws, f"{PREFIX}grace-in", now - 1)  # its host is ending it now
    untagged = _queue(aws, f"{PREFIX}byhand", None)  # younger than the longest TTL
    garbled = _queue(aws, f"{PREFIX}garbled", None)
    aws.sqs.tag_queue(QueueUrl=garbled, Tags={TAG_EXPIRES: "soon"})
    forever = _queue(aws, f"{PREFIX}forever", None)  # a tag no session carries: its age counts
    aws.sqs.tag_queue(QueueUrl=forever, Tags={TAG_EXPIRES: "inf"})
    other = _queue(aws, "Other-s-old-in", now - 3600)  # another stack's

    reaped = reap(aws.sqs, PREFIX, now=now)

    assert sorted(reaped.deleted) == sorted(expired)
    assert reaped.kept == 5
    left = set(aws.sqs.list_queues().get("QueueUrls", []))
    assert {live, in_grace, untagged, garbled, forever, other} <= left
    assert not set(expired) & left
    # An untagged queue goes once it is older than any session could be.
    later = reap(aws.sqs, PREFIX, now=now + MAX_TTL_S + GRACE_S + 60)
    assert {untagged, garbled, forever, live, in_grace} == set(later.deleted)
    assert reap(aws.sqs, PREFIX, now=now).deleted == []  # nothing twice
