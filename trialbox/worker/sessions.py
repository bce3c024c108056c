"""A worker hosts sessions: each on a thread of its own, fed the calls that name it by the
worker's one inbox queue (made when the worker first hosts a session, deleted when it stops),
and answering on its client's reply queue. After every call that ran, the workspace is
checkpointed (content-addressed: an unchanged workspace stores nothing new) before the reply
goes, so a reply always names a durable checkpoint. Idle for `idle_release_s`, the slot is
freed; the next call restores the last checkpoint. Under rlimit (a task hosts one session and
nothing else), an idle release ends the hosting too: the client is told `released`, the
task's wipe check runs and it takes other work, and the session's next call reopens it on any
worker from its checkpoint. At the TTL the host ends the session.

While a call runs, the host sends `alive` every ALIVE_S (the first on receipt: the client
knows the call started). A client that hears nothing for FAILOVER_S takes the worker for
lost and reopens the session elsewhere from its last checkpoint."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trialbox.keys import session_call_key, sha256_hex
from trialbox.models import Status
from trialbox.models.result import reward_for
from trialbox.models.sessions import (
    ALIVE_S,
    TAG_EXPIRES,
    Call,
    CallResult,
    Reply,
    SessionSpec,
    StepAside,
)
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import MiB, Runner
from trialbox.sandbox.session import SessionWorkspace, WorkspaceError
from trialbox.scoring.feedback import command_feedback
from trialbox.sqs_batch import deletions, send_to_queues
from trialbox.worker.checkpoint_io import load_checkpoint, save_checkpoint
from trialbox.worker.protection import TaskProtection

log = logging.getLogger("trialbox.worker.sessions")

POLL_S = 20  # the inbox's long poll, at most
# The inbox's expiry tag: this far ahead, renewed halfway (the reaper deletes the inbox of a
# worker that died without deleting it, once the tag passes).
INBOX_TAG_S = 3600
INBOX_MESSAGE: TypeAdapter[Call | StepAside] = TypeAdapter(Call | StepAside)
KEPT_REPLIES = 8  # answered calls kept for a re-sent seq
MAX_REPLY_CHARS = 200_000  # SQS takes 256 KiB; a larger result is read from its trace file
# A session stores at most this many times its disk_mb of checkpoints over its life: past
# it, a call that changes the workspace is the policy's error (not the platform's).
CHECKPOINT_QUOTA_FACTOR = 4
KEPT_STORED = 64
CHECKPOINT_NICE = 10  # the checkpointing thread's nice value (per thread; its children keep it)


class SessionHost:
    def __init__(
        self,
        runner: Runner,
        sqs: Any,
        store: ObjectStore,
        name: str,
        protection: TaskProtection | None = None,
        *,
        queue_prefix: str,
    ) -> None:
        self.runner = runner
        self.inbox = Inbox(sqs, f"{queue_prefix}w-{uuid.uuid4().hex}", self._route)
        self.protection = protection or TaskProtection(None)
        self.sqs = sqs
        self.store = store
        self.name = name
        self.stopping = threading.Event()
        # rlimit (a Fargate task): sessions of one task would share its /tmp, /proc and IPC,
        # so a task hosts one session at a time and nothing else meanwhile.
        self.exclusive = runner.backend.name == "rlimit"
        self._sessions: dict[str, HostedSession] = {}
        self._lock = threading.Lock()
        self._working = 0  # session calls and jobs running on this worker now
        self._jobs = 0  # jobs this worker took and runs (under rlimit: no session meanwhile)

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Around a call or a job: while it runs, the worker's other work is counted in each
        call's `alive`, so that a worker that ran out of memory is blamed on a call only when
        it was the one thing running."""
        with self._lock:
            self._working += 1
        try:
            yield
        finally:
            with self._lock:
                self._working -= 1

    def others(self) -> int:
        """Work running besides the caller's own."""
        with self._lock:
            return max(0, self._working - 1)

    def room(self) -> int:
        """Sessions this worker can take now: under rlimit one, while it runs nothing else;
        else one per slot but one (which stays for the pool's jobs)."""
        with self._lock:
            return self._room()

    def _room(self) -> int:
        if self.exclusive:
            return 0 if self._sessions or self._jobs else 1
        return max(0, max(1, self.runner.config.slots - 1) - len(self._sessions))

    @contextlib.contextmanager
    def job(self) -> Iterator[bool]:
        """Around a job the worker took: False (the job goes back to the queue) when under
        rlimit the task took a session meanwhile (the open queue's reader runs beside it)."""
        with self._lock:
            seated = not (self.exclusive and self._sessions)
            self._jobs += seated
        try:
            yield seated
        finally:
            with self._lock:
                self._jobs -= seated

    def admit(self, specs: list[SessionSpec]) -> tuple[int, list[HostedSession]]:
        """Host the first of `specs` there is room for: how many were taken (their messages
        go; the rest go back to the queue for another worker), and the sessions to `start`
        (a duplicate open of a session hosted here is taken, and hosted once)."""
        admitted: list[HostedSession] = []
        with self._lock:
            taken = min(len(specs), self._room())
            for spec in specs[:taken]:
                hosted = self._sessions.get(spec.session_id)
                if hosted is not None:
                    if spec.epoch <= hosted.spec.epoch:  # a duplicate: the first one serves
                        continue
                    # The client took this host for lost (it was only slow) and reopened: the
                    # new epoch serves from the checkpoint, the old one steps aside.
                    hosted.closed = True
                session = HostedSession(self, spec)
                self._sessions[spec.session_id] = session
                admitted.append(session)
        return taken, admitted

    def start(self, sessions: list[HostedSession]) -> None:
        """Say `opened` for the fresh sessions (no state to make durable first), in batches
        per client, and start every session's thread (those with state say it themselves)."""
        fresh = [s for s in sessions if s.fresh]
        replies = [
            (s.spec.reply_url, s.opened().model_dump_json(exclude_defaults=True)) for s in fresh
        ]
        for failed in send_to_queues(self.sqs, replies):
            fresh[failed].announced = False  # its thread says it, with its own retries
        for session in sessions:
            name = session.spec.session_id
            threading.Thread(target=session.serve, daemon=True, name=name).start()
        self._protect()

    def held(self) -> int:
        with self._lock:
            return len(self._sessions)

    def stop(self) -> None:
        """End hosting: the sessions' threads end (their clients fail over) and the inbox
        goes."""
        self.stopping.set()
        self.inbox.close()

    def _route(self, message: Call | StepAside) -> None:
        """An inbox message to the session it names; a call for a session not hosted here
        (released, ended, or moved on) is answered `released`, so its client reopens it."""
        with self._lock:
            hosted = self._sessions.get(message.session_id)
        if hosted is not None:
            hosted.mailbox.put(message)
            return
        if isinstance(message, Call):
            reply = Reply(
                kind="released", session_id=message.session_id, epoch=message.epoch,
                seq=message.seq, worker=self.name,
            )  # fmt: skip
            self.sqs.send_message(
                QueueUrl=message.reply_url, MessageBody=reply.model_dump_json(exclude_defaults=True)
            )

    def _ended(self, session: HostedSession) -> None:
        with self._lock:
            if self._sessions.get(session.spec.session_id) is session:
                del self._sessions[session.spec.session_id]
        self._protect()

    def _protect(self) -> None:
        with self._lock:
            expiries = [s.spec.expires_at for s in self._sessions.values()]
        self.protection.update(len(expiries), max(expiries, default=None))


class HostedSession:
    def __init__(self, host: SessionHost, spec: SessionSpec) -> None:
        self.host = host
        self.spec = spec
        self.answered = spec.seq
        self.checkpoint = spec.checkpoint
        self.workspace: SessionWorkspace | None = None
        self.replies: OrderedDict[int, CallResult] = OrderedDict()
        self.last_call = time.monotonic()
        self.closed = False
        self.restored_s: float | None = None  # a restore not yet reported by a call
        # The bytes of checkpoints this host stored for the session (CHECKPOINT_QUOTA_FACTOR),
        # and the last KEPT_STORED of them: going back to one of those stores nothing.
        self.stored: OrderedDict[str, None] = OrderedDict()
        self.stored_bytes = spec.stored_bytes  # a reopened session's quota goes on
        self.mailbox: queue.Queue[Call | StepAside] = queue.Queue()  # from the inbox
        # Opened with no state (no checkpoint, no files): its host says `opened` as it starts.
        self.fresh = spec.checkpoint is None and not spec.files
        self.announced = self.fresh

    # --- the thread -----------------------------------------------------------------------

    def serve(self) -> None:
        try:
            with self.host.working():  # a restore and a checkpoint: children in the task's memory
                self._open()
            while not self.closed and not self.host.stopping.is_set():
                left = self.spec.expires_at - time.time()
                if left <= 0:
                    self._expire()
                    return
                idle = time.monotonic() - self.last_call
                if self._releasable() and idle >= self.spec.idle_release_s:
                    self._release()  # durable already: every reply named a checkpoint
                    if self.host.exclusive:  # the task goes back to the pool's work
                        self._tell(
                            "released", seq=self.answered, checkpoint=self.checkpoint,
                            stored_bytes=self.stored_bytes,
                        )  # fmt: skip
                        return
                self._poll(left)
        except Exception as exc:
            log.exception("%s: the session failed", self.spec.session_id)
            self._tell("failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._release()
            self.host._ended(self)

    def _releasable(self) -> bool:
        """Whether an idle release frees anything: a workspace, or under rlimit the task
        itself (a session with no workspace yet, a fresh open not called or one a refused
        call dropped, holds the task all the same)."""
        return self.workspace is not None or self.host.exclusive

    def _open(self) -> None:
        """Its workspace is made now when the open brings state (a checkpoint, files: made
        durable before `opened` names them); a fresh session of a task is only the task's
        starter files, written at its first call (an open costs the queue's round trips)."""
        if not self.fresh:
            started = time.monotonic()
            self.workspace = self._workspace(self.checkpoint, self.spec.files)
            if self.checkpoint is not None:  # a failover's or a fork's: its first call says so
                self.restored_s = time.monotonic() - started
            self._save()
        if not self.announced:
            self._send(self.opened())

    def opened(self) -> Reply:
        return Reply(
            kind="opened", session_id=self.spec.session_id, epoch=self.spec.epoch,
            worker=self.host.name, seq=self.answered, checkpoint=self.checkpoint,
            inbox_url=self.host.inbox.url,
        )  # fmt: skip

    def _poll(self, left: float) -> None:
        wait = min(POLL_S, left)
        if self._releasable():
            wait = min(
                wait, max(0.0, self.spec.idle_release_s - (time.monotonic() - self.last_call))
            )
        try:
            message = self.mailbox.get(timeout=max(0.05, wait))
        except queue.Empty:
            return
        if isinstance(message, StepAside):
            if message.epoch > self.spec.epoch:  # reopened elsewhere: this host ends it
                log.warning("%s: superseded by epoch %d", self.spec.session_id, message.epoch)
                self.closed = True
            return
        self._handle(message)

    def _handle(self, call: Call) -> None:
        if call.reply_url != self.spec.reply_url:  # another client's: never this session's
            log.warning(
                "%s: a call naming another client's reply queue; ignored", self.spec.session_id
            )
            return
        if call.epoch != self.spec.epoch:  # sent to an earlier or a later host: not this one's
            log.warning(
                "%s: a call of epoch %d on the host of epoch %d; ignored",
                self.spec.session_id, call.epoch, self.spec.epoch,
            )  # fmt: skip
            return
        if call.seq <= self.answered:
            kept = self.replies.get(call.seq)
            if kept is not None:  # a re-sent call: its recorded result, never a second run
                trace = self.host.store.uri(session_call_key(self.spec.session_id, call.seq))
                self._reply(kept, trace)
            return
        self.last_call = time.monotonic()
        done = threading.Event()
        ticker = threading.Thread(target=self._alive, args=(call.seq, done), daemon=True)
        with self.host.working():
            self._tell("alive", seq=call.seq, others=self.host.others())
            ticker.start()
            try:
                result = self._run(call)
            finally:
                done.set()
                ticker.join()
        self.answered = call.seq
        self.replies[call.seq] = result
        while len(self.replies) > KEPT_REPLIES:
            self.replies.popitem(last=False)
        self.last_call = time.monotonic()
        key = session_call_key(self.spec.session_id, call.seq)
        record = {"call": call.model_dump(mode="json"), "result": result.model_dump(mode="json")}
        if len(result.model_dump_json()) > MAX_REPLY_CHARS:  # the reply points at the trace
            self._reply(result, self.host.store.put_json(key, record))
        else:  # the trace off the reply's path
            self._reply(result)
            self.host.store.put_json(key, record)
        if call.op == "close":
            self.closed = True

    def _alive(self, seq: int, done: threading.Event) -> None:
        while not done.wait(ALIVE_S):
            try:
                self._tell("alive", seq=seq, others=self.host.others())
            except Exception:  # the next one may get through; the client waits ALIVE_S more
                log.warning("%s: an alive message failed", self.spec.session_id, exc_info=True)

    # --- one call -------------------------------------------------------------------------

    def _run(self, call: Call) -> CallResult:
        base = {
            "session_id": self.spec.session_id,
            "seq": call.seq,
            "op": call.op,
            "worker": self.host.name,
        }
        if call.op == "close":
            self._release()
            return CallResult(**base, status=Status.SUCCEEDED, checkpoint=self.checkpoint)
        restored_s, self.restored_s = self.restored_s, None
        try:
            if self.workspace is None:  # released when idle, or never made (a fresh open)
                started = time.monotonic()
                self.workspace = self._workspace(self.checkpoint, {})
                if self.checkpoint is not None:
                    restored_s = time.monotonic() - started
            workspace = self.workspace
            if call.op == "read":
                data = workspace.read(call.path or "")
                return CallResult(
                    **base,
                    status=Status.SUCCEEDED,
                    restored_s=restored_s,
                    content=base64.b64encode(data).decode(),
                    checkpoint=self.checkpoint,
                )
            if call.files:
                workspace.write(call.files)
            timeout_s = min(self._timeout(call), workspace.limits.timeout_s)
            commands = [workspace.exec(argv, timeout_s) for argv in call.commands]
            undone = self._save_or_undo()
        except WorkspaceError as exc:
            # The policy's mistake, told back, and the session goes on; a call that may have
            # changed the workspace is undone (the next call restores the last checkpoint).
            if call.op != "read":
                self._release()
            status = Status.SUCCEEDED
            return CallResult(
                **base,
                status=status,
                error=str(exc),
                feedback=str(exc),
                restored_s=restored_s,
                checkpoint=self.checkpoint,
            )
        except Exception as exc:
            log.exception("%s: call %d failed", self.spec.session_id, call.seq)
            self._release()  # the next call starts again from the last checkpoint
            error = f"{type(exc).__name__}: {exc}"
            return CallResult(
                **base,
                status=Status.SANDBOX_ERROR,
                loss_mask=True,
                error=error,
                feedback=f"sandbox error (not your code): {error}",
                checkpoint=self.checkpoint,
            )
        status = next(
            (c.status for c in commands if c.status != Status.SUCCEEDED), Status.SUCCEEDED
        )
        _, loss_mask = reward_for(status, None)
        feedback = command_feedback(
            commands, workspace.limits.model_copy(update={"timeout_s": timeout_s})
        )
        return CallResult(
            **base,
            status=status,
            loss_mask=loss_mask,
            commands=commands,
            error=undone,
            feedback=feedback if undone is None else f"{feedback}\n{undone}".strip(),
            checkpoint=self.checkpoint,
            restored_s=restored_s,
        )

    def _save_or_undo(self) -> str | None:
        """`_save` after a call's commands; None, or when the workspace they left cannot be
        kept (WorkspaceError: not checkpointable, the storage quota spent), the call is undone
        and the reason returned. The call's status is still its commands' (a refused checkpoint
        never turns a scored timeout or oom into a success)."""
        try:
            self._save()
        except WorkspaceError as exc:
            self._release()  # the next call restores the last checkpoint
            return str(exc)
        return None

    def _timeout(self, call: Call) -> float:
        """A command's timeout: the call's, cut at the TTL (the host ends the session then,
        so nothing runs on past it)."""
        left = max(0.001, self.spec.expires_at - time.time())
        return left if call.timeout_s is None else min(call.timeout_s, left)

    # --- state ----------------------------------------------------------------------------

    def _workspace(self, checkpoint: str | None, files: dict[str, Any]) -> SessionWorkspace:
        data = None if checkpoint is None else load_checkpoint(self.host.store, checkpoint)
        spec = self.spec
        with _lowered_priority():  # the restore's child keeps it, as a checkpoint's does
            return SessionWorkspace(self.host.runner, spec.workspace, spec.limits, data, files)

    def _save(self) -> None:
        """Make the workspace durable before the reply names it (stored once per content,
        and built only when the workspace changed). Its compression is the session's own CPU
        (a child in the slot's accounting: SessionWorkspace.checkpoint), started from this
        thread at a lower priority, which the child keeps: a session writing large
        checkpoints slows its own calls, not its neighbours'."""
        workspace = self.workspace
        assert workspace is not None
        with _lowered_priority():
            data = workspace.checkpoint()
        if data is None:
            return
        checkpoint = sha256_hex(data)
        if checkpoint == self.checkpoint or checkpoint in self.stored:
            self.checkpoint = checkpoint
            return  # stored already
        quota = CHECKPOINT_QUOTA_FACTOR * workspace.limits.disk_mb * MiB
        if self.stored_bytes + len(data) > quota:
            raise WorkspaceError(
                f"the session's checkpoint storage is spent: {self.stored_bytes / MiB:.1f} MiB "
                f"stored, and this call's checkpoint ({len(data) / MiB:.1f} MiB) would pass "
                f"the {quota // MiB} MiB a session may store ({CHECKPOINT_QUOTA_FACTOR} x "
                "disk_mb); the call is undone. Calls that leave the workspace as it is go on."
            )
        self.checkpoint = save_checkpoint(self.host.store, data)
        self.stored_bytes += len(data)
        self.stored[checkpoint] = None
        while len(self.stored) > KEPT_STORED:
            self.stored.popitem(last=False)

    def _release(self) -> None:
        if self.workspace is not None:
            workspace, self.workspace = self.workspace, None
            workspace.release()

    def _expire(self) -> None:
        log.info("%s: TTL reached; ending it", self.spec.session_id)
        self._release()

    def _reply(self, result: CallResult, trace: str | None = None) -> None:
        # The bytes stored so far ride on every result: a failover's next host goes on
        # counting from them (the client relays them), not from zero.
        fields: dict[str, Any] = {
            "seq": result.seq, "checkpoint": result.checkpoint, "stored_bytes": self.stored_bytes
        }  # fmt: skip
        if len(result.model_dump_json()) > MAX_REPLY_CHARS and trace is not None:
            self._tell("result", result_uri=trace, **fields)
        else:
            self._tell("result", result=result, **fields)

    def _tell(self, kind: str, **fields: Any) -> None:
        reply = Reply.model_validate(
            {
                "kind": kind,
                "session_id": self.spec.session_id,
                "epoch": self.spec.epoch,
                "worker": self.host.name,
            }
            | fields
        )
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        self.host.sqs.send_message(
            QueueUrl=self.spec.reply_url, MessageBody=reply.model_dump_json(exclude_defaults=True)
        )


@contextlib.contextmanager
def _lowered_priority() -> Iterator[None]:
    """This thread at CHECKPOINT_NICE for the block (Linux: a nice value per thread)."""
    thread = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, thread)
    os.setpriority(os.PRIO_PROCESS, thread, max(before, CHECKPOINT_NICE))
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, thread, before)
        except OSError as exc:  # raising it back needs CAP_SYS_NICE: the thread stays niced
            log.warning("cannot restore the session thread's priority: %s", exc)


class Inbox:
    """A worker's one queue for the calls of every session it hosts: made on first use,
    tagged with an expiry it renews while it lives, and read by one thread that hands each
    message to `route`. Deleted at `close`; a worker that dies leaves it to the reaper."""

    def __init__(self, sqs: Any, name: str, route: Any) -> None:
        self.sqs, self.name, self.route = sqs, name, route
        self.url: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._tagged_until = 0.0

    def ensure(self) -> str:
        with self._lock:
            if self.url is None:
                expires = time.time() + INBOX_TAG_S
                made = self.sqs.create_queue(
                    QueueName=self.name, tags={TAG_EXPIRES: str(int(expires))}
                )
                self.url, self._tagged_until = made["QueueUrl"], expires
                threading.Thread(target=self._read, daemon=True, name=self.name).start()
            return self.url

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            url, self.url = self.url, None
        if url is not None:
            try:
                self.sqs.delete_queue(QueueUrl=url)
            except Exception:  # the reaper deletes it once its tag passes
                log.warning("deleting the inbox %s failed", url, exc_info=True)

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                self._renew()
                self._take()
            except Exception:
                if self._closed.is_set():
                    return
                log.exception("%s: reading the inbox failed; reading again", self.name)
                self._closed.wait(1)

    def _renew(self) -> None:
        if self._tagged_until - time.time() > INBOX_TAG_S / 2 or self.url is None:
            return
        expires = time.time() + INBOX_TAG_S
        self.sqs.tag_queue(QueueUrl=self.url, Tags={TAG_EXPIRES: str(int(expires))})
        self._tagged_until = expires

    def _take(self) -> None:
        url = self.url
        if url is None:
            return
        answer = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=POLL_S
        )
        messages = answer.get("Messages", [])
        if not messages:
            return
        # Deleted on receipt: a call never runs twice, even if this worker dies mid-call.
        self.sqs.delete_message_batch(QueueUrl=url, Entries=deletions(messages))
        for message in messages:
            try:
                routed = INBOX_MESSAGE.validate_json(message["Body"])
            except ValidationError as exc:
                log.error("%s: dropping a message that is not a call: %s", self.name, exc)
                continue
            try:
                self.route(routed)
            except Exception:  # one session's reply queue gone: the others' calls go on
                log.exception("%s: routing a message failed", self.name)
