"""The dispatcher: one requests-queue message in, exactly one of: an execution started, alone or
with the others of its SQS batch as one batch execution (trialbox.pipeline.batching), or
found already started with the same content, nothing (the request already has its terminal
result, e.g. its client cancelled it), a `rejected` result, a dead letter, or the message sent
back to the requests queue, because the pool had no free slot for it until the invocation's
time ran out (admission: trialbox.pipeline.admission)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from trialbox.constants import MAX_INLINE_REQUEST_BYTES
from trialbox.keys import PAYLOADS_PREFIX, execution_arn, payload_key
from trialbox.models import ExecutionRequest, Status, result_for
from trialbox.models.jobs import RequestPointer, RolloutInput
from trialbox.models.sample import REQUEST_ID
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.batching import BatchStarter
from trialbox.pipeline.record import record, validation_message
from trialbox.pipeline.stores import ObjectStore, ResultTable, unreadable

log = logging.getLogger("trialbox.dispatcher")


class Dispatched(StrEnum):
    STARTED = "started"
    BATCHED = "batched"  # started with others, as one batch (trialbox.pipeline.batching)
    ALREADY_STARTED = "already_started"
    ALREADY_ENDED = "already_ended"  # cancelled by its client before it started, say
    REJECTED = "rejected"
    DEAD_LETTERED = "dead_lettered"
    REQUEUED = "requeued"  # no slot came free in time: it waits in the requests queue again


# While every slot is taken, the dispatcher asks again this often (the capacity is re-read at
# most every CAPACITY_CACHE_S); a release is seen within it.
ADMIT_POLL_S = 0.1


def recover(body: str) -> tuple[dict[str, Any], str | None]:
    """A requests-queue message's JSON object, and its request id if it has a valid one."""
    try:
        raw = json.loads(body)
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return {}, None
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        return raw, None
    return raw, request_id


@dataclass(frozen=True)
class Admitted:
    """A request the pool admitted, not started yet (Dispatcher.start)."""

    rollout: RolloutInput
    body: str
    redelivered: bool  # admitted before: an execution may carry it already


@dataclass
class Dispatcher:
    sfn: Any
    rollout_arn: str
    table: ResultTable
    payloads: ObjectStore
    dead_letter: Callable[[str, str], None]  # (body, reason)
    admission: Admission
    requeue: Callable[[str], None]  # (body): back to the requests queue, as a new message
    batches: BatchStarter | None = None  # None: every request starts alone

    def __call__(self, body: str, wait_until: float | None = None) -> Dispatched:
        """One request alone: admitted, then started as its own execution. `wait_until`
        (time.monotonic()): how long a request may wait here for a slot before it goes back
        to the queue; None: not at all."""
        admitted = self.admit(body, wait_until)
        if isinstance(admitted, Dispatched):
            return admitted
        return self.start([admitted])[admitted.rollout.request_id]

    def admit(
        self,
        body: str,
        wait_until: float | None = None,
        before_waiting: Callable[[], object] | None = None,
    ) -> Dispatched | Admitted:
        """A request admitted (its start is the caller's: `start`), or what became of it.
        `before_waiting`: called once before the request waits for a slot (the handler
        starts what it admitted so far, which must not wait with it)."""
        raw, request_id = recover(body)
        if request_id is None:
            self.dead_letter(body, "no recoverable request_id")
            return Dispatched.DEAD_LETTERED
        pointer = None
        if "payload_uri" in raw:
            try:
                pointer = RequestPointer.model_validate(raw)
                raw = json.loads(self._payload(pointer))
            except (ValidationError, ValueError, OSError) as exc:
                return self._reject(request_id, f"payload_uri: the payload cannot be read ({exc})")
        try:
            request = ExecutionRequest.model_validate(raw)
        except ValidationError as exc:
            return self._reject(request_id, validation_message(exc))
        if request.request_id != request_id:
            return self._reject(request_id, "request_id: differs from the pointer's request_id")
        ended, recorded_for = self.table.terminal(request_id)
        content = request.content_sha256()
        if ended and recorded_for not in (None, content):
            return self._reused(body, request_id)
        if ended:  # nothing to run: it ended already (its client cancelled it, say)
            return Dispatched.ALREADY_ENDED
        if pointer is None and len(body.encode()) > MAX_INLINE_REQUEST_BYTES:
            pointer = self._offload(request_id, content, body)
        rollout = RolloutInput(
            request_id=request_id,
            request=None if pointer else request,
            payload_uri=pointer.payload_uri if pointer else None,
            content_sha256=content,
        )
        new = self.admission.admit_new(request_id)
        if new is None:
            if before_waiting is not None:
                before_waiting()
            if not self._admitted(request_id, wait_until):
                self.requeue(body)
                return Dispatched.REQUEUED
            new = True
        if self.table.terminal(request_id)[0]:  # it ended while it waited (cancelled, say)
            self.admission.release(request_id)
            return Dispatched.ALREADY_ENDED
        return Admitted(rollout, body, redelivered=not new)

    def start(self, admitted: list[Admitted]) -> dict[str, Dispatched]:
        """Start what `admit` admitted: one request alone as its own execution, several as one
        batch. A redelivered request already carried by an execution (its own, or a batch's)
        starts nothing again."""
        outcomes: dict[str, Dispatched] = {}
        fresh = []
        for one in admitted:
            found = self._already(one) if one.redelivered else None
            if found is None:
                fresh.append(one)
            else:
                outcomes[one.rollout.request_id] = found
        if len(fresh) == 1 or (fresh and self.batches is None):
            for one in fresh:
                outcomes[one.rollout.request_id] = self._start(one.rollout, one.body)
        elif fresh:
            self._start_batch(fresh)
            outcomes |= {one.rollout.request_id: Dispatched.BATCHED for one in fresh}
        return outcomes

    def _already(self, one: Admitted) -> Dispatched | None:
        """A redelivered request's execution, if one carries it already."""
        request_id = one.rollout.request_id
        if self.batches is not None and self.batches.carried_by(request_id):
            return Dispatched.ALREADY_STARTED
        try:
            return self._existing(one.rollout, one.body)
        except self.sfn.exceptions.ExecutionDoesNotExist:
            return None

    def _start_batch(self, admitted: list[Admitted]) -> None:
        assert self.batches is not None
        for one in admitted:
            self.batches.add(one.rollout)
        try:
            self.batches.start()
        except Exception:
            # Their messages come back (or dead-letter); meanwhile their slots are for
            # others, unless the batch did start after all.
            if self.batches.carried_by(admitted[0].rollout.request_id) is None:
                for one in admitted:
                    self.admission.release(one.rollout.request_id)
            raise

    def _admitted(self, request_id: str, wait_until: float | None) -> bool:
        """Wait for a slot, after a first ask that found none (and no marker)."""
        while True:
            if wait_until is None or time.monotonic() + ADMIT_POLL_S > wait_until:
                return False
            time.sleep(ADMIT_POLL_S)
            if self.admission.admit(request_id, again=True):
                return True

    def _payload(self, pointer: RequestPointer) -> bytes:
        """A large request, only from where the SDK puts them. A missing or forbidden object is
        the request's fault (ValueError); any other S3 error is retried with the message."""
        allowed = self.payloads.uri(PAYLOADS_PREFIX)
        if not pointer.payload_uri.startswith(allowed):
            raise ValueError(f"{pointer.payload_uri!r} is not under {allowed}")
        try:
            return self.payloads.get_bytes(pointer.payload_uri)
        except ClientError as exc:
            if code := unreadable(exc):
                raise ValueError(f"{code} for {pointer.payload_uri}") from exc
            raise

    def _offload(self, request_id: str, content: str, body: str) -> RequestPointer:
        """A large request sent inline (SQS takes up to 1 MiB, not through the SDK, which sends
        a pointer itself): stored where the SDK stores them, so the execution's state stays
        within Step Functions' 256 KiB."""
        uri = self.payloads.put_bytes(payload_key(content), body.encode(), "application/json")
        return RequestPointer(request_id=request_id, payload_uri=uri)

    def _reject(self, request_id: str, message: str) -> Dispatched:
        result = result_for(
            request_id, Status.REJECTED, error=message, feedback=f"rejected: {message}"
        )
        record(result, self.table, None)  # an existing terminal result stays as it is
        return Dispatched.REJECTED

    def _start(self, rollout: RolloutInput, body: str) -> Dispatched:
        payload = rollout.model_dump_json(exclude_none=True)
        try:
            self.sfn.start_execution(
                stateMachineArn=self.rollout_arn, name=rollout.request_id, input=payload
            )
            return Dispatched.STARTED
        except self.sfn.exceptions.ExecutionAlreadyExists:
            pass
        except Exception:
            # Throttled past botocore's retries, say: the message comes back (or dead-letters),
            # and meanwhile its slot is for others, unless the start did happen after all.
            self._release_unstarted(rollout.request_id)
            raise
        return self._existing(rollout, body)

    def _existing(self, rollout: RolloutInput, body: str) -> Dispatched:
        """The request's Rollout execution exists: the same content runs once; other content
        under its id is dead-lettered (ExecutionDoesNotExist when there is none)."""
        existing = self.sfn.describe_execution(
            executionArn=execution_arn(self.rollout_arn, rollout.request_id)
        )
        started = RolloutInput.model_validate_json(existing["input"])
        if started.content_sha256 == rollout.content_sha256:
            return Dispatched.ALREADY_STARTED  # a redelivered or resubmitted request: runs once
        return self._reused(body, rollout.request_id)

    def _release_unstarted(self, request_id: str) -> None:
        try:
            self.sfn.describe_execution(executionArn=execution_arn(self.rollout_arn, request_id))
        except self.sfn.exceptions.ExecutionDoesNotExist:
            self.admission.release(request_id)
        except Exception:  # unknown: the slot stays held until the DLQ's consumer or the reaper
            return

    def _reused(self, body: str, request_id: str) -> Dispatched:
        self.dead_letter(body, f"request_id {request_id} reused with different content")
        return Dispatched.DEAD_LETTERED


@dataclass
class Starts:
    """One dispatcher invocation: each message admitted in turn, and what was admitted started
    together, as one batch, once every message was looked at, or sooner, before a message
    waits for a slot (what is admitted never waits for what is not)."""

    dispatcher: Dispatcher
    held: list[tuple[str, Admitted]] = field(default_factory=list)  # (message id, admitted)
    failed: list[str] = field(default_factory=list)  # message ids whose start failed

    def add(self, message_id: str, body: str, wait_until: float | None) -> Dispatched | None:
        """What became of the message; None: admitted, started by `flush`."""
        got = self.dispatcher.admit(body, wait_until, before_waiting=self.flush)
        if isinstance(got, Dispatched):
            return got
        self.held.append((message_id, got))
        return None

    def flush(self) -> list[Dispatched]:
        """Start what is held; the messages of a start that failed are `failed` (they come
        back, or dead-letter)."""
        held, self.held = self.held, []
        if not held:
            return []
        try:
            return list(self.dispatcher.start([one for _, one in held]).values())
        except Exception:
            log.exception("starting %d admitted request(s) failed", len(held))
            self.failed += [message_id for message_id, _ in held]
            return []
