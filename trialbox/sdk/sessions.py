"""Sessions: one workspace that evolves over many tool calls, then a grade (docs/sdk.md,
"Sessions").

No queue is a session's own. Opening one sends a message on the stack's open queue (opens
made together leave in one SendMessageBatch); a worker with room for sessions takes up to 10
at a time and answers `opened`, naming its inbox (one per worker, for every
session it hosts). Calls go to that inbox and replies come back on the client's one reply
queue (made at its first session, deleted when it closes), each message naming its session:
SQS "virtual queues". No call goes through a state machine or a function; a grade is one
ordinary execution, from the session's last checkpoint.

Failover: a worker says `alive` as soon as it receives a call and every second while it
runs. Silence for FAILOVER_S means the worker is lost: the client reopens the session on the
open queue from its last checkpoint (durable before any reply named it). A call the lost
worker had not started is sent again; one it had started returns `sandbox_error` with
`loss_mask` (its effects, if any, are not in the checkpoint). Either way the session goes on.
A worker that no longer hosts the session (released when idle under rlimit, so that its task
serves other work) answers `released`: the client reopens it from its checkpoint and sends
the call again, as for a call the lost worker had not started.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from trialbox import keys
from trialbox.errors import AwsCallError, InputError, SessionError, TrialboxError
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task
from trialbox.models.common import FileContent
from trialbox.models.limits import LimitOverrides
from trialbox.models.report import CommandResult
from trialbox.models.sample import TaskRef
from trialbox.models.sessions import (
    FAILOVER_S,
    MAX_TTL_S,
    OPEN_TIMEOUT_S,
    TAG_EXPIRES,
    Call,
    CallResult,
    Reply,
    SessionOpen,
    SessionSpec,
    StepAside,
)
from trialbox.sdk.arguments import ForkArguments, ReadArguments, arguments
from trialbox.sdk.aws import call
from trialbox.sdk.inputs import located
from trialbox.sdk.tasksets import taskset_rows
from trialbox.sqs_batch import deletions

if TYPE_CHECKING:
    from trialbox.sdk.aws import Aws
    from trialbox.sdk.resources import Resources

log = logging.getLogger("trialbox.sdk.sessions")

REPLY_WAIT_S = 1  # a session's wait for its next reply: short, so that silence is noticed
RECEIVE_WAIT_S = 2  # the reply queue's long poll (its receivers run while a session waits)
WAITERS_PER_RECEIVER = 16  # one receiver of the reply queue per this many waiting sessions
MAX_RECEIVERS = 8
# The reply queue's expiry tag: the latest session's TTL, rounded up to this step, so that
# sessions opened together retag it once (SQS allows 30 tagging calls/s).
REPLY_TAG_STEP_S = 30
GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
MAX_MESSAGE_BYTES = 1000 * 1024  # SQS takes 1 MiB; the rest of the message is small
IO_THREADS = 256  # blocking SQS calls of concurrent sessions (long polls, mostly)
OOM_MARK = "OutOfMemoryError"  # ECS's reason for a container killed at its memory limit
FATE_WAIT_S = 30.0  # ECS marks a task STOPPED within this after its container dies


ARGV_NOT_A_STRING = "a command is a list of strings (argv), not one string: ['sh', '-c', 'ls -l']"


def _commands(commands: Iterable[Sequence[str]]) -> list[list[str]]:
    """Each command as a list (any iterable of them is read once: a generator's commands
    all run); a string where a list belongs is an InputError, never split into one-letter
    arguments."""
    if isinstance(commands, str):
        raise InputError("commands: a list of commands, not one string: [['sh', '-c', 'ls']]")
    if not isinstance(commands, Iterable) or isinstance(commands, bytes | Mapping):
        raise InputError(f"commands: a list of commands, got {type(commands).__name__}")
    listed = list(commands)
    for index, command in enumerate(listed):
        if isinstance(command, str):
            raise InputError(f"commands[{index}]: {ARGV_NOT_A_STRING}")
    return [list(c) if isinstance(c, Sequence) else c for c in listed]


def _gone(exc: AwsCallError) -> bool:
    """The queue does not exist (a worker's inbox, deleted as it stopped)."""
    cause = exc.__cause__
    return isinstance(cause, ClientError) and cause.response["Error"]["Code"] in GONE


def _fits(body: str, what: str) -> str:
    """A message SQS takes, or an InputError saying what to do: the caller's files (or a
    model's answer written as one) are too large, nothing is sent, and the session goes on."""
    size = len(body.encode())
    if size > MAX_MESSAGE_BYTES:
        raise InputError(
            f"{what} are too large for one session message ({size} bytes, at most "
            f"{MAX_MESSAGE_BYTES}): write large files over several calls"
        )
    return body


class SessionContext:
    """What a client's sessions share with it, and all they use of it: its AWS calls (and so
    where the stack is), a way to grade, their I/O threads, their reply queue, and the
    sessions still open (the client closes them with itself)."""

    def __init__(
        self,
        aws: Aws,
        grade: Callable[[ExecutionRequest, float | None], Awaitable[ExecutionResult]],
    ) -> None:
        self.aws = aws
        self.grade = grade
        self.open: set[AsyncSession] = set()
        self._io: SessionIO | None = None
        self._replies: ReplyQueue | None = None
        self._opens: OpenSender | None = None

    @property
    def resources(self) -> Resources:
        return self.aws.resources

    @property
    def io(self) -> SessionIO:
        if self._io is None:
            self._io = SessionIO(self.aws)
        return self._io

    @property
    def replies(self) -> ReplyQueue:
        if self._replies is None:
            self._replies = ReplyQueue(self.io, self.resources.session_queue_prefix or "")
        return self._replies

    @property
    def opens(self) -> OpenSender:
        if self._opens is None:
            self._opens = OpenSender(self.io, self.resources.open_queue_url or "")
        return self._opens

    def track(self, session: AsyncSession) -> None:
        """Open until it closes, or until the client does."""
        self.open.add(session)
        session.on_close = self.open.discard

    async def close(self) -> None:
        if self._replies is not None:
            await self._replies.close()
        if self._io is not None:
            self._io.close()


class OpenSender:
    """A client's session opens, sent together: the opens waiting when a send starts leave
    in SendMessageBatch calls (SQS's caps: `Aws.send`), so that 256 sessions opened at once
    cost about 26 calls, while an open alone leaves at once."""

    def __init__(self, io: SessionIO, url: str) -> None:
        self.io, self.url = io, url
        self.waiting: list[tuple[str, str, asyncio.Future[None]]] = []
        self.sender: asyncio.Future[None] | None = None  # kept: the loop holds tasks weakly

    async def send(self, session_id: str, body: str) -> None:
        """Once SQS has the open; AwsCallError (why) if it refused it or the call failed."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((session_id, body, sent))
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._drain())
        await sent

    async def _drain(self) -> None:
        while self.waiting:
            taken, self.waiting = self.waiting, []
            try:
                outcome = await self.io.run(
                    self.io.aws.send,
                    bodies=[(sid, body) for sid, body, _ in taken],
                    queue_url=self.url,
                )
            except Exception as exc:  # not SQS's: every open taken fails with it
                for _, _, sent in taken:
                    if not sent.done():
                        sent.set_exception(exc)
                continue
            for sid, _, sent in taken:
                if sent.done():  # its session was cancelled meanwhile
                    continue
                if sid in outcome.refused:
                    sent.set_exception(AwsCallError(f"SendMessageBatch: {outcome.refused[sid]}"))
                elif sid in outcome.unattempted and outcome.error is not None:
                    sent.set_exception(outcome.error)
                else:
                    sent.set_result(None)


class ReplyQueue:
    """A client's one queue for the replies to all its sessions, each to its session's
    mailbox. Receivers run only while some session waits for a reply (an idle session costs
    no call), one per WAITERS_PER_RECEIVER waiting sessions."""

    def __init__(self, io: SessionIO, prefix: str) -> None:
        self.io = io
        self.prefix = prefix
        self.url: str | None = None
        self.tagged_until = 0.0
        self.mailboxes: dict[str, asyncio.Queue[Reply]] = {}
        self.waiting = 0
        self._made: asyncio.Lock | None = None
        self._receivers: set[asyncio.Future[None]] = set()

    async def register(self, session_id: str, expires_at: float) -> str:
        """The queue's URL (made on first use, or again once the reaper may have taken it),
        its tag covering `expires_at`; the session's replies are kept for it from now."""
        if self._made is None:
            self._made = asyncio.Lock()
        async with self._made:
            now = time.time()
            tag = min(now + MAX_TTL_S, math.ceil(expires_at / REPLY_TAG_STEP_S) * REPLY_TAG_STEP_S)
            sqs = self.io.aws.sqs
            if self.url is None or self.tagged_until <= now:
                made = await self.io.run(
                    sqs.create_queue,
                    QueueName=f"{self.prefix}c-{uuid.uuid4().hex}",
                    tags={TAG_EXPIRES: str(int(tag))},
                )
                self.url, self.tagged_until = made["QueueUrl"], tag
            elif expires_at > self.tagged_until:
                await self.io.run(
                    sqs.tag_queue, QueueUrl=self.url, Tags={TAG_EXPIRES: str(int(tag))}
                )
                self.tagged_until = tag
        self.mailboxes.setdefault(session_id, asyncio.Queue())
        return self.url

    def unregister(self, session_id: str) -> None:
        self.mailboxes.pop(session_id, None)

    async def wait(self, session_id: str, timeout: float) -> list[Reply]:
        """The session's replies: those that came, or the first within `timeout` ([] if none)."""
        box = self.mailboxes.get(session_id)
        if box is None:  # closed meanwhile: nothing comes, but the caller's loop still waits
            await asyncio.sleep(timeout)
            return []
        if box.empty():
            self.waiting += 1
            self._pump()
            try:
                first = await asyncio.wait_for(box.get(), timeout)
            except TimeoutError:
                return []
            finally:
                self.waiting -= 1
            replies = [first]
        else:
            replies = []
        while not box.empty():
            replies.append(box.get_nowait())
        return replies

    def _pump(self) -> None:
        wanted = min(MAX_RECEIVERS, math.ceil(self.waiting / WAITERS_PER_RECEIVER))
        while len(self._receivers) < wanted:
            receiver = asyncio.ensure_future(self._receive())
            self._receivers.add(receiver)
            receiver.add_done_callback(self._receivers.discard)

    async def _receive(self) -> None:
        sqs = self.io.aws.sqs
        while self.url is not None:  # once at least: a waiter started it
            url = self.url
            try:
                answer = await self.io.run(
                    sqs.receive_message,
                    QueueUrl=url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=RECEIVE_WAIT_S,
                )
                messages = answer.get("Messages", [])
                if messages:
                    await self.io.run(
                        sqs.delete_message_batch, QueueUrl=url, Entries=deletions(messages)
                    )
            except AwsCallError as exc:  # the waiting sessions hear nothing, and fail over
                log.warning("reading the session reply queue failed: %s", exc)
                await asyncio.sleep(1)
                messages = []
            for message in messages:
                try:
                    reply = Reply.model_validate_json(message["Body"])
                except ValidationError as exc:
                    log.error("dropping a reply that is not one: %s", exc)
                    continue
                box = self.mailboxes.get(reply.session_id)
                if box is not None:  # else: a closed session's late reply
                    box.put_nowait(reply)
            if self.waiting == 0:
                return

    async def close(self) -> None:
        for receiver in list(self._receivers):
            receiver.cancel()
        url, self.url = self.url, None
        if url is not None:
            try:
                await self.io.run(self.io.aws.sqs.delete_queue, QueueUrl=url)
            except TrialboxError as exc:  # the reaper deletes it once its tag passes
                log.warning("deleting the session reply queue %s failed: %s", url, exc)


class SessionIO:
    """The blocking calls a session makes, on one executor shared by a client's sessions."""

    def __init__(self, aws: Aws) -> None:
        self.aws = aws
        self.executor = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="trialbox-session")
        self._tasks: dict[str, dict[str, tuple[int, Any]]] = {}  # task set -> (line, row) by id

    async def run(self, fn: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: call(fn, **kwargs))

    async def task(self, ref: str) -> Task:
        """A pushed task; SessionError when the ref is malformed or names no task (the
        caller's to fix), AwsCallError when S3 cannot be read."""
        try:
            parsed = TaskRef.parse(ref)
        except ValueError as exc:
            raise SessionError(f"task_ref: {exc}") from None
        key = keys.taskset_key(parsed.taskset, parsed.version)
        if key not in self._tasks:
            try:
                answer = await self.run(
                    self.aws.s3.get_object, Bucket=self.aws.resources.tasksets_bucket, Key=key
                )
            except AwsCallError as exc:
                cause = exc.__cause__
                if isinstance(cause, ClientError) and cause.response["Error"]["Code"] in (
                    "NoSuchKey", "404",
                ):  # fmt: skip
                    raise SessionError(
                        f"task_ref {ref!r}: no task set {parsed.taskset}@{parsed.version} "
                        "was pushed to this deployment"
                    ) from None
                raise
            body = await asyncio.to_thread(answer["Body"].read)
            self._tasks[key] = taskset_rows(body, f"{parsed.taskset}@{parsed.version}")
        found = self._tasks[key].get(parsed.task_id)
        if found is None:
            raise SessionError(f"task_ref: no task {parsed.task_id!r} in {parsed.taskset}")
        number, raw = found
        try:
            return Task.model_validate(raw)
        except ValidationError as exc:
            where = f"task {ref!r} (line {number} of its task set)"
            raise InputError(f"{where}: {located(exc, '')}") from None

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class AsyncSession:
    """A session on asyncio; `Client.session` gives the blocking face of the same object."""

    def __init__(
        self,
        context: SessionContext,
        task: Task,
        task_ref: str | None,
        *,
        limits: LimitOverrides,
        ttl_s: float,
        idle_release_s: float,
        run_id: str | None,
        episode_id: str | None,
        tags: dict[str, str],
        files: dict[str, FileContent] | None = None,
        checkpoint: str | None = None,
    ) -> None:
        if not 1 <= ttl_s <= MAX_TTL_S:  # nan too
            raise SessionError(f"ttl_s must be between 1 and {MAX_TTL_S} s, got {ttl_s}")
        if not (idle_release_s > 0 and math.isfinite(idle_release_s)):
            raise SessionError(f"idle_release_s must be a positive number, got {idle_release_s}")
        self.context = context
        self.io: SessionIO = context.io
        self.task = task
        self.task_ref = task_ref
        self.overrides = limits
        self.session_id = uuid.uuid4().hex
        self.expires_at = time.time() + ttl_s
        self.idle_release_s = idle_release_s
        self.run_id, self.episode_id, self.tags = run_id, episode_id, tags
        self.checkpoint = checkpoint
        self.seq = 0  # calls answered (or settled by a failover)
        self.worker: str | None = None
        self.failovers = 0
        self.epoch = 0  # opens after the first (failovers, and reopens after a release)
        self.closed = False
        self._files = files or {}
        self._inbox = ""  # the hosting worker's
        self._stored_bytes = 0  # checkpoint bytes stored, as its hosts' replies said
        self._reply_url = ""
        self.on_close: Callable[[AsyncSession], None] | None = None
        self._turn = asyncio.Lock()  # one call at a time: calls are numbered in order

    # --- lifetime -------------------------------------------------------------------------

    async def open(self) -> AsyncSession:
        resources = self.context.resources
        if not (resources.open_queue_url and resources.session_queue_prefix):
            raise SessionError(
                "this deployment names no open queue or session queue prefix: deploy this "
                "version's stack (its outputs name them)"
            )
        replies = self.context.replies
        self._reply_url = await replies.register(self.session_id, self.expires_at)
        try:
            await self._open_on_a_worker(self._files, settled=0)
        except BaseException:
            replies.unregister(self.session_id)
            raise
        self._files = {}
        return self

    def ttl_left(self) -> float:
        return self.expires_at - time.time()

    async def close(self) -> None:
        """End the session: the worker frees its slot, the queues go. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.on_close is not None:
            self.on_close(self)
        try:
            if self.ttl_left() > 0 and self._inbox:
                async with self._turn:  # after the call in flight, if any
                    await self._call(self._make_call(op="close"), timeout=30, failover=False)
        except TrialboxError as exc:  # the worker is gone or the session expired: nothing held
            log.info("session %s: closing: %s", self.session_id, exc)
        finally:
            self.context.replies.unregister(self.session_id)

    async def __aenter__(self) -> AsyncSession:
        if not self._reply_url:
            await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- calls ----------------------------------------------------------------------------

    async def step(
        self,
        files: dict[str, FileContent] | None = None,
        commands: Iterable[Sequence[str]] = (),
        timeout_s: float | None = None,
    ) -> CallResult:
        """Write `files`, then run each command (each with the session's per-command limit,
        or `timeout_s` if lower). `feedback` is the text for the model's next turn."""
        return await self._next(
            op="exec", files=files or {}, commands=_commands(commands), timeout_s=timeout_s
        )

    async def exec(
        self, argv: Sequence[str], timeout_s: float | None = None
    ) -> CommandResult | CallResult:
        """One command: its result (a CallResult instead if the platform failed the call)."""
        if isinstance(argv, str):
            raise InputError(f"argv: {ARGV_NOT_A_STRING}")
        result = await self.step(commands=[argv], timeout_s=timeout_s)
        return result.commands[0] if result.commands else result

    async def write_files(self, files: dict[str, FileContent]) -> CallResult:
        return await self._next(op="exec", files=files)

    async def read_file(self, path: str) -> bytes:
        path = arguments(ReadArguments, path=path).path
        result = await self._next(op="read", path=path)
        if result.content is None:
            raise SessionError(result.error or f"{path}: could not be read")
        return base64.b64decode(result.content)

    async def fork(self, n: int) -> list[AsyncSession]:
        """`n` new sessions, each from this one's current workspace (its last checkpoint).
        If any cannot open, those that did are closed and the first error is raised."""
        n = arguments(ForkArguments, n=n).n
        forks = [self._child() for _ in range(n)]
        outcomes = await asyncio.gather(*(f.open() for f in forks), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            await asyncio.gather(*(f.close() for f in forks if f._reply_url))
            raise failed[0]
        for fork in forks:
            self.context.track(fork)
        return forks

    async def grade(self, timeout: float | None = None) -> ExecutionResult:
        """The hidden tests on the current workspace: one execution through the pipeline,
        with the reward rules of any other. Grading the same state again returns the same
        result (the request id is the session's and its call count's)."""
        request = ExecutionRequest(
            request_id=f"{self.session_id}-grade-{self.seq}",
            run_id=self.run_id,
            task_ref=self.task_ref,
            task=None if self.task_ref else self.task,
            base_checkpoint=self.checkpoint,
            limits=self.overrides,
            tags=self.tags,
        )
        return await self.context.grade(request, timeout)

    # --- the protocol -----------------------------------------------------------------------

    def _child(self) -> AsyncSession:
        return AsyncSession(
            self.context,
            self.task,
            self.task_ref,
            limits=self.overrides,
            ttl_s=max(1.0, self.ttl_left()),
            idle_release_s=self.idle_release_s,
            run_id=self.run_id,
            episode_id=self.episode_id,
            tags=self.tags,
            checkpoint=self.checkpoint,
        )

    async def _next(self, **fields: Any) -> CallResult:
        async with self._turn:  # a call sent while another runs waits for it
            if self.closed:
                raise SessionError(f"session {self.session_id} is closed")
            if self.ttl_left() <= 0:
                raise SessionError(f"session {self.session_id} expired (its TTL passed)")
            try:
                call = self._make_call(**fields)
            except ValidationError as exc:  # nothing is sent, and the session goes on
                raise InputError(located(exc, "")) from None
            return await self._call(call)

    def _make_call(self, **fields: Any) -> Call:
        return Call(
            session_id=self.session_id, reply_url=self._reply_url, seq=self.seq + 1, **fields
        )

    async def _call(
        self, request: Call, timeout: float | None = None, failover: bool = True
    ) -> CallResult:
        """Send the call; its result. On a lost worker (silence, its session thread failed,
        or its inbox gone): reopen elsewhere and send it again if it had not started, or
        return it as `sandbox_error` if it had. A worker that released the session: reopen
        and send it again. Without `failover`, a lost worker is a SessionError (and a
        released session is closed already)."""
        request = request.model_copy(update={"epoch": self.epoch})
        sent = await self._send(request)
        started = alone = False
        host = self.worker
        heard = time.monotonic()
        deadline = None if timeout is None else heard + timeout
        while True:
            failed = not sent
            released = False
            for reply in await self._replies() if sent else []:
                if reply.epoch != self.epoch:
                    continue  # a superseded host's
                if reply.kind == "failed":
                    failed = True  # the host's session thread died: as good as lost
                # The checkpoint bytes stored so far (a result's, a release's): the quota a
                # reopen carries on, whichever way the session next leaves this host.
                self._stored_bytes = max(self._stored_bytes, reply.stored_bytes)
                if reply.kind == "released":
                    released = True
                if reply.seq != request.seq or reply.kind not in ("alive", "result"):
                    continue  # a stale reply (an earlier call's)
                heard = time.monotonic()
                if reply.kind == "alive":
                    started, alone, host = True, reply.others == 0, reply.worker
                else:
                    return await self._settle(reply)
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise SessionError(f"session {self.session_id}: no answer within {timeout} s")
            if released and not started:
                if request.op == "close":  # nothing is held: closed already
                    return self._closed_result(request)
                await self._reopen(request.seq - 1, failover=False)
            elif failed or now - heard > FAILOVER_S:
                if not failover:
                    raise SessionError(f"session {self.session_id}: its worker was lost")
                if self.ttl_left() <= 0:
                    raise SessionError(f"session {self.session_id} expired (its TTL passed)")
                # Why the worker stopped, asked while the session reopens: only a call that
                # ran alone on it can be blamed for its running out of memory.
                fate = asyncio.ensure_future(
                    self._stop_reason(host if alone and not failed and sent else None)
                )
                try:
                    await self._reopen(request.seq if started else request.seq - 1)
                except BaseException:
                    fate.cancel()
                    raise
                if started:
                    return self._lost(request, await fate)
                fate.cancel()
            else:
                continue
            request = request.model_copy(update={"epoch": self.epoch})
            sent = await self._send(request)
            heard = time.monotonic()

    async def _send(self, request: Call) -> bool:
        """Whether the call reached the host's inbox (False: the inbox is gone, the worker
        stopped)."""
        body = _fits(request.model_dump_json(exclude_defaults=True), "a call's files")
        try:
            await self.io.run(self.io.aws.sqs.send_message, QueueUrl=self._inbox, MessageBody=body)
        except AwsCallError as exc:
            if _gone(exc):
                return False
            raise
        return True

    def _closed_result(self, request: Call) -> CallResult:
        return CallResult(
            session_id=self.session_id,
            seq=request.seq,
            op=request.op,
            status=Status.SUCCEEDED,
            checkpoint=self.checkpoint,
        )

    async def _settle(self, reply: Reply) -> CallResult:
        result = reply.result
        if result is None and reply.result_uri is not None:
            raw = await asyncio.to_thread(self.io.aws.read_object, reply.result_uri)
            result = CallResult.model_validate(json.loads(raw)["result"])
        if result is None:
            raise SessionError(f"session {self.session_id}: a reply without a result")
        self.seq = max(self.seq, result.seq)
        self.checkpoint = result.checkpoint or self.checkpoint
        self.worker = reply.worker
        return result

    async def _stop_reason(self, worker: str | None) -> str | None:
        """Why the lost worker's ECS task stopped, once ECS says (None: unknown)."""
        if worker is None or ":task/" not in worker or not self.context.resources.cluster:
            return None
        deadline = time.monotonic() + FATE_WAIT_S
        while True:
            try:
                reason: str | None = await self.io.run(self.io.aws.stop_reason, task_arn=worker)
            except Exception:  # e.g. an older client policy without ecs:DescribeTasks
                return None
            if reason is not None or time.monotonic() > deadline:
                return reason
            await asyncio.sleep(1)

    def _lost(self, request: Call, stop_reason: str | None) -> CallResult:
        self.seq = request.seq
        if stop_reason is not None and OOM_MARK in stop_reason:
            # The call, alone on its worker, ran the whole worker out of memory: the
            # policy's failure, scored. Its effects are gone with the worker.
            status, loss_mask = Status.OOM, False
            error = f"the call ran its worker out of memory ({stop_reason})"
            feedback = f"out of memory: {error}; the workspace is as it was before this call"
        else:
            status, loss_mask = Status.SANDBOX_ERROR, True
            error = "the worker running this call was lost; the session goes on from the last "
            error += "checkpoint" + (f" (ECS: {stop_reason})" if stop_reason else "")
            feedback = f"sandbox error (not your code): {error}"
        return CallResult(
            session_id=self.session_id,
            seq=request.seq,
            op=request.op,
            status=status,
            loss_mask=loss_mask,
            error=error,
            feedback=feedback,
            checkpoint=self.checkpoint,
        )

    async def _reopen(self, settled: int, failover: bool = True) -> None:
        """Open the session again, from its last checkpoint, on whichever worker takes it; a
        host of the earlier epoch that is still there (it was only slow) ends its own."""
        earlier = self._inbox
        self.epoch += 1
        self.failovers += failover
        await self._open_on_a_worker({}, settled)
        if failover and earlier and earlier != self._inbox:
            aside = StepAside(session_id=self.session_id, epoch=self.epoch)
            try:
                await self.io.run(
                    self.io.aws.sqs.send_message,
                    QueueUrl=earlier,
                    MessageBody=aside.model_dump_json(),
                )
            except AwsCallError as exc:  # gone with its worker: nothing to end
                log.info("session %s: the earlier host's inbox: %s", self.session_id, exc)

    async def _open_on_a_worker(self, files: dict[str, FileContent], settled: int) -> None:
        spec = SessionSpec(
            session_id=self.session_id,
            task_id=self.task.task_id,
            workspace=self.task.workspace,
            limits=self.overrides.tighten(self.task.limits),
            checkpoint=self.checkpoint,
            files=files,
            seq=settled,
            epoch=self.epoch,
            expires_at=self.expires_at,
            idle_release_s=self.idle_release_s,
            reply_url=self._reply_url,
            stored_bytes=self._stored_bytes,
            run_id=self.run_id,
            episode_id=self.episode_id,
            tags=self.tags,
        )
        opening = SessionOpen(session=spec).model_dump_json(exclude_defaults=True)
        body = _fits(opening, "the task's starter files and the session's files")
        await self.context.opens.send(self.session_id, body)
        deadline = time.monotonic() + min(OPEN_TIMEOUT_S, max(1.0, self.ttl_left()))
        while time.monotonic() < deadline:
            for reply in await self._replies():
                if reply.epoch != self.epoch:
                    continue  # an earlier open's
                if reply.kind == "opened" and reply.inbox_url:
                    self.worker, self.checkpoint, self.seq = reply.worker, reply.checkpoint, settled
                    self._inbox = reply.inbox_url
                    return
                if reply.kind == "failed" and reply.seq == 0:
                    raise SessionError(f"session {self.session_id} could not open: {reply.error}")
        raise SessionError(
            f"session {self.session_id}: no worker took it within {OPEN_TIMEOUT_S:.0f} s "
            "(is the pool running, with a free slot?)"
        )

    async def _replies(self) -> list[Reply]:
        return await self.context.replies.wait(self.session_id, REPLY_WAIT_S)
