"""A worker's reader of the stack's open queue. While the worker has room for sessions, it
takes up to 10 opens at a time (never more than its room), hosts them and deletes them in
one call; the worker's `opened` replies to them leave in batches too (SessionHost.start).

Opens have a queue of their own, so that a worker reads them 10 at a time without taking
jobs it has no slot for, and jobs never wait behind opens. Under rlimit a task hosts a session
or runs a job, never both: an open taken while a job started (the two readers run side by
side) goes back to the queue at once for another worker, as a job taken while a session
started does (Worker.handle)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trialbox.models.sessions import SessionOpen, SessionSpec
from trialbox.sqs_batch import deletions

if TYPE_CHECKING:
    from trialbox.worker.sessions import SessionHost

log = logging.getLogger("trialbox.worker.opener")

ROOM_WAIT_S = 0.5  # with no room, look again this often (a session ends, a job finishes)
RETRY_PAUSE_S = 1.0


class Opener:
    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        host: SessionHost,
        stop: threading.Event,
        *,
        wait_s: int,
        on_hosted: threading.Event,
    ) -> None:
        self.sqs, self.queue_url, self.host, self.stop = sqs, queue_url, host, stop
        self.wait_s = wait_s
        self.on_hosted = on_hosted  # set when an exclusive host took a session: no slot now

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve, daemon=True, name="opener")
        thread.start()
        return thread

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                if not self.poll_once():
                    self.stop.wait(ROOM_WAIT_S)
            except Exception:
                log.exception("reading the open queue failed; reading again")
                self.stop.wait(RETRY_PAUSE_S)

    def poll_once(self) -> bool:
        """Whether there was room to read the queue."""
        room = self.host.room()
        if room <= 0:
            return False
        answer = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=min(10, room), WaitTimeSeconds=self.wait_s
        )
        messages = answer.get("Messages", [])
        if not messages:
            return True
        if self.stop.is_set():  # told to stop during the long poll: every open goes back
            self._return(messages)
            return True
        specs: list[SessionSpec] = []
        opens: list[dict[str, Any]] = []
        dropped: list[dict[str, Any]] = []
        for message in messages:
            try:
                specs.append(SessionOpen.model_validate_json(message["Body"]).session)
                opens.append(message)
            except ValidationError as exc:
                log.error("dropping an open-queue message that is not an open: %s", exc)
                dropped.append(message)
        try:
            self.host.inbox.ensure()  # before any open is taken: `opened` names it
        except Exception:
            self._return(opens)
            self._delete(dropped)
            raise
        taken, admitted = self.host.admit(specs)
        try:
            self._delete(opens[:taken] + dropped)  # taken: a dying worker loses its sessions only
            self._return(opens[taken:])
        finally:  # admitted is hosted: never left without its thread (a slot held for good)
            self.host.start(admitted)
        if admitted and self.host.exclusive:
            self.on_hosted.set()
        return True

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        if messages:
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=deletions(messages))

    def _return(self, messages: list[dict[str, Any]]) -> None:
        for message in messages:
            self.sqs.change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
