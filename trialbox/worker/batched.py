"""A worker's side of a batched sample (docs/batches.md): claim it, keep its lease while the
sandbox runs, and tell the finisher how it ended. No task token: the sample's liveness is its
claim (trialbox.pipeline.claims), its answer a Finished message on the finish queue.

- A sample another worker holds alive is left in the queue, out of view for a lease.
- A sample cancelled, finished elsewhere, or lost past its retries is never run: the finisher
  is told, so that its batch counts it (and records `Sandbox.Lost` for the last).
- A run whose claim moved on (taken over after a lapse, cancelled, past its deadline) is
  dropped: its report is not sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from trialbox.constants import ERROR_LOST, ERROR_SANDBOX, LOST_SANDBOX_RETRIES
from trialbox.models.batches import BatchWork, Finished
from trialbox.pipeline.claims import Claim, Claims, Moved, Refused

log = logging.getLogger("trialbox.worker")

# (the job's uri, its request id, the lost flag) -> ("success", report uri) or ("failure", cause)
RunSample = Callable[[str, str, threading.Event], tuple[str, str]]


@dataclass
class BatchedJobs:
    sqs: Any
    work_queue: str
    finish_queue: str
    claims: Claims
    heartbeat_s: int
    name: str

    def handle(self, work: BatchWork, receipt: str, run: RunSample) -> bool:
        """Whether this worker ran the sample's sandbox."""
        claim = self.claims.claim(work.request_id, self.name, work.budget_s)
        if claim is Refused.HELD:  # alive elsewhere: look again once its lease could lapse
            self._visible_in(receipt, self.claims.lease_s)
            return False
        if isinstance(claim, Refused):
            self._not_run(work, claim)
            self._delete(receipt)
            return False
        started_at = time.time()
        lost, done = threading.Event(), threading.Event()
        keeper = threading.Thread(
            target=self._keep, args=(claim, receipt, done, lost), name="claim", daemon=True
        )
        keeper.start()
        try:
            kind, value = run(work.job_uri, work.request_id, lost)
        finally:
            done.set()
            keeper.join()
        # The last word on whose run this is: a claim that moved on drops its report.
        if lost.is_set() or not self.claims.finish(claim):
            return self._dropped(work, claim, receipt)
        self._finish(
            work,
            outcome="report" if kind == "success" else "failure",
            report_uri=value if kind == "success" else None,
            error=None if kind == "success" else ERROR_SANDBOX,
            cause=None if kind == "success" else value,
            worker=self.name,
            attempt=claim.attempt,
            started_at=started_at,
            finished_at=time.time(),
        )
        self._delete(receipt)
        return True

    def _dropped(self, work: BatchWork, claim: Claim, receipt: str) -> bool:
        """The run is not the sample's any more. Whoever has it next is told: the finisher
        (cancelled: its slot goes back, its batch counts it), the next claim (a run past its
        deadline or lease gives it up: attempt + 1, at once), or nobody (taken over, or
        finished by another copy: their message, their finish)."""
        why = self.claims.why_not(claim)
        log.warning("%s: its claim moved on (%s); dropping the run", work.request_id, why.value)
        if why is Moved.CANCELLED:
            self._finish(work, outcome="not_run", cause=why.value, worker=self.name)
            self._delete(receipt)
        elif why is Moved.LAPSED:
            self.claims.give_up(claim)
            self._visible_in(receipt, 0)
        elif why is Moved.GONE:
            self._delete(receipt)
        return True

    def _not_run(self, work: BatchWork, refused: Refused) -> None:
        if refused is Refused.EXHAUSTED:
            cause = f"its sandbox was lost {LOST_SANDBOX_RETRIES + 1} times (no lease renewed)"
            self._finish(
                work,
                outcome="not_run",
                error=ERROR_LOST,
                cause=cause,
                attempt=LOST_SANDBOX_RETRIES,
            )
        else:  # cancelled, or finished: its result is another's to write
            self._finish(work, outcome="not_run", cause=refused.value)

    def _finish(self, work: BatchWork, **fields: Any) -> None:
        message = Finished(
            batch_id=work.batch_id,
            request_id=work.request_id,
            job_uri=work.job_uri,
            content_sha256=work.content_sha256,
            **fields,
        )
        self.sqs.send_message(QueueUrl=self.finish_queue, MessageBody=message.model_dump_json())

    def _keep(
        self, claim: Claim, receipt: str, done: threading.Event, lost: threading.Event
    ) -> None:
        """Renew the claim, and the message's visibility with it, every heartbeat / 3; a
        renewal refused (the claim moved on) or none through for a lease sets `lost`."""
        interval = max(1.0, self.heartbeat_s / 3)
        renewed_at = time.monotonic()
        while not done.wait(interval):
            try:
                if not self.claims.renew(claim):
                    lost.set()
                    return
                renewed_at = time.monotonic()
                self._visible_in(receipt, self.claims.lease_s)
            except (ClientError, BotoCoreError):
                log.exception("%s: renewing its claim failed; trying again", claim.request_id)
            if time.monotonic() - renewed_at > self.claims.lease_s:
                log.error("%s: no renewal got through for a lease: it lapsed", claim.request_id)
                lost.set()
                return

    def _visible_in(self, receipt: str, seconds: float) -> None:
        self.sqs.change_message_visibility(
            QueueUrl=self.work_queue, ReceiptHandle=receipt, VisibilityTimeout=int(seconds)
        )

    def _delete(self, receipt: str) -> None:
        self.sqs.delete_message(QueueUrl=self.work_queue, ReceiptHandle=receipt)
