"""The reaper: deletes the session queues nobody is left to delete. A worker deletes its inbox
as it stops and a client its reply queue as it closes; one that died (a task lost, a trainer
SIGKILLed) leaves its queue. A scheduled function deletes every session queue whose
`trialbox:expires_at` tag (set when the queue is made, renewed while its owner needs it) is
past, and an untagged one (made by hand with the prefix) once it is older than the longest
TTL. Its work grows with the workers and clients, never with the sessions."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from trialbox.models.sessions import MAX_TTL_S, TAG_EXPIRES

log = logging.getLogger("trialbox.reaper")

# Past the TTL: the host ends its own sessions first. A call running at the TTL is cut there
# (its commands' timeouts end at the TTL); its checkpoint and reply take less than this.
GRACE_S = 60
GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


@dataclass
class Reaped:
    deleted: list[str] = field(default_factory=list)
    kept: int = 0


def expiry(sqs: Any, url: str) -> float:
    """When the queue's owner stops needing it (epoch s)."""
    tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
    with contextlib.suppress(KeyError, ValueError):
        tagged = float(tags[TAG_EXPIRES])
        if math.isfinite(tagged) and 0 < tagged <= time.time() + MAX_TTL_S:
            return tagged
    # No tag, or one no session could carry: as old as the longest session.
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["CreatedTimestamp"])
    return float(attributes["Attributes"]["CreatedTimestamp"]) + MAX_TTL_S


def reap(sqs: Any, prefix: str, now: float | None = None) -> Reaped:
    """Delete the session queues (named `prefix`...) whose session ended GRACE_S ago."""
    now = time.time() if now is None else now
    reaped = Reaped()
    # Without a page size, ListQueues gives the first 1,000 and no next token.
    pages = sqs.get_paginator("list_queues").paginate(
        QueueNamePrefix=prefix, PaginationConfig={"PageSize": 1000}
    )
    for page in pages:
        for url in page.get("QueueUrls", []):
            try:
                if expiry(sqs, url) + GRACE_S > now:
                    reaped.kept += 1
                    continue
                sqs.delete_queue(QueueUrl=url)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in GONE:  # else: ended meanwhile
                    log.error("%s: %s; the next run tries again", url, exc)
                continue
            log.info("deleted %s: its expiry passed", url)
            reaped.deleted.append(url)
    return reaped
