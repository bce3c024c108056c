"""Messages sent SendMessageBatch at a time: the SDK's requests and session opens, and a
worker's `opened` replies to the sessions it took together."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import groupby
from typing import Any

log = logging.getLogger("trialbox.sqs_batch")

# SendMessageBatch's caps: 10 entries, and 256 KiB for all the bodies together.
MAX_BATCH_ENTRIES = 10
MAX_BATCH_BYTES = 256 * 1024


def batches(bodies: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """Consecutive runs of (key, message body) that fit one SendMessageBatch call (a body
    over MAX_BATCH_BYTES goes alone)."""
    batch: list[tuple[str, str]] = []
    size = 0
    for key, body in bodies:
        length = len(body.encode())
        if batch and (len(batch) == MAX_BATCH_ENTRIES or size + length > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((key, body))
        size += length
    if batch:
        yield batch


def deletions(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """DeleteMessageBatch's entries for received `messages` (at most 10: one receive's)."""
    return [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]


def send_to_queues(sqs: Any, messages: list[tuple[str, str]]) -> list[int]:
    """Send each (queue URL, body), a batch per queue at a time (botocore retries each
    call); the indexes of the messages not sent (SQS failed them, or their call failed), for
    the caller to send another way."""
    failed: list[int] = []
    ordered = sorted(range(len(messages)), key=lambda i: messages[i][0])
    for url, group in groupby(ordered, key=lambda i: messages[i][0]):
        for batch in batches([(str(i), messages[i][1]) for i in group]):
            try:
                answer = sqs.send_message_batch(
                    QueueUrl=url, Entries=[{"Id": i, "MessageBody": b} for i, b in batch]
                )
            except Exception:
                log.warning("sending %d message(s) to %s failed", len(batch), url, exc_info=True)
                failed += [int(i) for i, _ in batch]
                continue
            failed += [int(f["Id"]) for f in answer.get("Failed", [])]
    return failed
