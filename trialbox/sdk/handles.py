"""Handles: one per submitted request, resolved with its terminal result."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

from trialbox.errors import WaitTimeout
from trialbox.models import ExecutionRequest, ExecutionResult


class AsyncHandle:
    """A submitted request. `await handle.result()` gives its terminal result."""

    def __init__(self, request: ExecutionRequest, content_sha256: str) -> None:
        self.request = request
        self.request_id = request.request_id
        self.content_sha256 = content_sha256
        self.future: asyncio.Future[ExecutionResult] = asyncio.get_running_loop().create_future()
        # The same outcome for other threads (the blocking Client waits on it, not the loop).
        self.shared: concurrent.futures.Future[ExecutionResult] = concurrent.futures.Future()
        self.submitted_at = time.monotonic()
        self.sent_at: float | None = None  # when it reached the requests queue
        self.finished_at: float | None = None

    @property
    def sent(self) -> bool:
        """Whether it left the client's admission queue for the pipeline."""
        return self.sent_at is not None

    @property
    def latency_s(self) -> float | None:
        """Seconds from being sent to its result arriving (None: not both yet)."""
        if self.sent_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.sent_at

    def done(self) -> bool:
        return self.future.done()

    async def result(self, timeout: float | None = None) -> ExecutionResult:
        """The terminal result; raises WaitTimeout when `timeout` seconds pass first (the
        request goes on running)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.future), timeout)
        except TimeoutError:
            raise WaitTimeout([self.request_id], timeout or 0) from None

    def resolve(self, result: ExecutionResult | BaseException) -> None:
        if self.future.done():
            return
        self.finished_at = time.monotonic()
        if isinstance(result, BaseException):
            self.future.set_exception(result)
            self.future.exception()  # retrieved here: an unawaited failure is not an error
            self.shared.set_exception(result)
        else:
            self.future.set_result(result)
            self.shared.set_result(result)

    def __repr__(self) -> str:
        state = "done" if self.done() else "sent" if self.sent else "waiting"
        return f"<AsyncHandle {self.request_id} {state}>"
