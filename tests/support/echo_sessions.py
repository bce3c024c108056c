"""A session worker for moto in-process tests of what sits above a session (the SDK's faces,
the trainer adapters' tools): it takes session opens from the open queue and answers each
call, read from its one inbox, on the session's reply queue with feedback that echoes the
call, without a sandbox. As the real host (trialbox/worker/sessions.py) it says `alive` on a
call's receipt and every ALIVE_S while it runs: a client that hears nothing for FAILOVER_S
takes the worker for lost."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from trialbox.models import Status
from trialbox.models.sessions import (
    ALIVE_S,
    Call,
    CallResult,
    Reply,
    SessionOpen,
    SessionSpec,
)


class EchoSessions:
    """Serves on a thread until `stop()`: `opened` lists each SessionSpec it took, `calls`
    each Call it answered (feedback `ran <argv>` per command, `wrote <paths>` for files)."""

    def __init__(self, sqs: Any, open_queue_url: str) -> None:
        self.sqs, self.open_queue_url = sqs, open_queue_url
        self.inbox = sqs.create_queue(QueueName=f"echo-inbox-{uuid.uuid4().hex}")["QueueUrl"]
        self.opened: list[SessionSpec] = []
        self.calls: list[Call] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="echo-sessions")
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            for body in self._take(self.open_queue_url):
                spec = SessionOpen.model_validate_json(body).session
                self.opened.append(spec)
                self._tell(spec, "opened", inbox_url=self.inbox)
            specs = {spec.session_id: spec for spec in self.opened}
            for body in self._take(self.inbox):
                call = Call.model_validate_json(body)
                self._answer(specs[call.session_id], call)
            time.sleep(0.01)

    def _answer(self, spec: SessionSpec, call: Call) -> None:
        """As the real host's `_handle`: `alive` on receipt and every ALIVE_S while the call
        runs, then its result. Was a flake of a loaded suite: with only the result, a client
        that heard nothing for FAILOVER_S (moto, slow) reopened the session and sent the call
        again, and two calls were echoed for one."""
        self._tell(spec, "alive", seq=call.seq)
        done = threading.Event()
        ticker = threading.Thread(target=self._alive, args=(spec, call.seq, done), daemon=True)
        ticker.start()
        try:
            result = self._run(spec, call)
        finally:
            done.set()
            ticker.join()
        self._tell(spec, "result", seq=call.seq, result=result)

    def _alive(self, spec: SessionSpec, seq: int, done: threading.Event) -> None:
        while not done.wait(ALIVE_S):
            self._tell(spec, "alive", seq=seq)

    def _run(self, spec: SessionSpec, call: Call) -> CallResult:
        self.calls.append(call)
        said = [f"ran {argv}" for argv in call.commands]
        if call.files:
            said.append(f"wrote {sorted(call.files)}")
        return CallResult(
            session_id=spec.session_id,
            seq=call.seq,
            op=call.op,
            status=Status.SUCCEEDED,
            feedback="\n".join(said),
            checkpoint=f"s3://traces/echo/{spec.session_id}/{call.seq}",
        )

    def _tell(self, spec: SessionSpec, kind: str, **fields: Any) -> None:
        head = {"kind": kind, "session_id": spec.session_id, "epoch": spec.epoch, "worker": "echo"}
        self._reply(spec, Reply.model_validate(head | fields))

    def _take(self, url: str) -> list[str]:
        try:
            answer = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        except Exception:  # the work queue's outage: the next turn reads it again
            return []
        for message in answer.get("Messages", []):
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return [m["Body"] for m in answer.get("Messages", [])]

    def _reply(self, spec: SessionSpec, reply: Reply) -> None:
        try:
            body = reply.model_dump_json(exclude_defaults=True)
            self.sqs.send_message(QueueUrl=spec.reply_url, MessageBody=body)
        except Exception:
            pass  # the client closed meanwhile (its reply queue went): nobody waits for this
