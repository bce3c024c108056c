"""Admission control for a run: at most `concurrency` requests in flight, the next submitted as
each result comes back.

A request the pipeline accepted stays in flight until its terminal result exists. Capping the
number in flight keeps the work queue no deeper than the pool can drain, so a queued job is not
mistaken for a lost one (Step Functions' heartbeat clock starts when the job is queued).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from trialbox.client import Client
from trialbox.models import ExecutionRequest, ExecutionResult

OnResult = Callable[[str, ExecutionResult, float | None], None]  # id, result, wall seconds
PER_WORKER = 4  # in flight per known pool worker: enough to keep each one busy
# When the pool's size is unknown (resource names given by hand without
# TRIALBOX_POOL_CAPACITY): modest, because a job queued longer than the heartbeat is retried.
UNKNOWN_CAPACITY_CONCURRENCY = 32


def default_concurrency(capacity: int | None) -> int:
    """How many requests to keep in flight for a pool of `capacity` workers (None: unknown)."""
    return PER_WORKER * capacity if capacity else UNKNOWN_CAPACITY_CONCURRENCY


class Driver:
    def __init__(
        self,
        client: Client,
        requests: list[ExecutionRequest],
        *,
        concurrency: int,
        on_result: OnResult,
        poll_s: float = 0.3,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.waiting = deque(requests)
        self.in_flight: dict[str, float] = {}  # request id -> when it was submitted
        self.concurrency = concurrency
        self.on_result = on_result
        self.poll_s = poll_s
        self.stopping = False

    def collect_recorded(self) -> None:
        """Results the pipeline already holds (a resumed run): taken, never re-executed."""
        found = self.client.poll([r.request_id for r in self.waiting])
        for rid, result in found.items():
            self.on_result(rid, result, None)
        self.waiting = deque(r for r in self.waiting if r.request_id not in found)

    def run(self, timeout_s: float) -> None:
        """Until every request has a result, the timeout passes, or `stopping` is set (by a
        signal handler, say); then `drain` waits for what is in flight."""
        deadline = time.monotonic() + timeout_s
        while (self.waiting or self.in_flight) and not self.stopping:
            if time.monotonic() >= deadline:
                return
            self._admit()
            self._collect()
            if self.waiting or self.in_flight:
                time.sleep(self.poll_s)

    def drain(self, grace_s: float) -> None:
        """Stop submitting; wait up to `grace_s` for the requests already in flight."""
        self.stopping = True
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            self._collect()
            if self.in_flight:
                time.sleep(self.poll_s)

    def _admit(self) -> None:
        """Fill the room up to `concurrency` (the client packs SendMessageBatch calls)."""
        room = min(self.concurrency - len(self.in_flight), len(self.waiting))
        if room <= 0 or self.stopping:
            return
        batch = [self.waiting.popleft() for _ in range(room)]
        # In flight before the call: an interrupted call may still have sent the batch.
        now = time.monotonic()
        self.in_flight.update((r.request_id, now) for r in batch)
        self.client.submit(batch)

    def _collect(self) -> None:
        if not self.in_flight:
            return
        for rid, result in self.client.poll(list(self.in_flight)).items():
            submitted = self.in_flight.pop(rid)
            self.on_result(rid, result, time.monotonic() - submitted)
