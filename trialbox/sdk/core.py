"""AsyncClient: the SDK's one implementation. `Client` runs it on a background event loop.

Submitted requests wait in the client's admission queue; at most `concurrency` are in the
pipeline at once, the next sent as each result arrives (a queue deeper than the pool drains
within its heartbeat would look like lost sandboxes). One pump task sends and polls for every
handle of the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlparse

import boto3

from trialbox import keys
from trialbox.errors import (
    AwsCallError,
    ClientClosed,
    InputError,
    MissingExtra,
    RequestIdReused,
    TrialboxError,
    WaitTimeout,
)
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task, result_for
from trialbox.models.common import FileContent
from trialbox.models.limits import LimitOverrides
from trialbox.sdk import groups
from trialbox.sdk.arguments import (
    ClientArguments,
    GroupArguments,
    PushArguments,
    SessionArguments,
    arguments,
)
from trialbox.sdk.aws import Aws, service
from trialbox.sdk.handles import AsyncHandle
from trialbox.sdk.inputs import (
    RequestInput,
    TaskInput,
    as_requests,
    as_tasks,
    task_or_ref,
)
from trialbox.sdk.resources import Resources, default_concurrency
from trialbox.sdk.sessions import AsyncSession, SessionContext
from trialbox.sdk.tasksets import TaskSetRef, tasks_body, taskset_ref
from trialbox.settings import ClientSettings
from trialbox.stack_version import check_stack_version

if TYPE_CHECKING:
    from trialbox.local.twin import LocalTwin

DEFAULT_TTL_S = 1800.0  # a session ends server-side this long after it opens
DEFAULT_IDLE_RELEASE_S = 30.0  # idle this long, its slot is freed (restored on the next call)

log = logging.getLogger("trialbox.sdk")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
POLL_S = 0.2  # the first poll after a send; it backs off to MAX_POLL_S while nothing arrives
MAX_POLL_S = 2.0
MAX_CALL_FAILURES = 5  # sends or polls failing in a row (after botocore's retries) end the wait
CANCELS_AT_ONCE = 16


def stack_resources(name: str, region: str | None, session: Any) -> tuple[Resources, Any]:
    """A deployed stack's resources from its outputs (its version checked), and the session
    that read them. Runs in the caller's thread, so that a warning points at its line."""
    session = session or boto3.session.Session(region_name=region)
    cfn = service(session, "cloudformation", None)
    try:
        described = cfn.describe_stacks(StackName=name)
    except Exception as exc:
        raise AwsCallError(f"cannot read stack {name!r} in {session.region_name}: {exc}") from exc
    stack = described["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    resources = Resources.from_outputs(outputs)
    check_stack_version(name, outputs)
    return resources, session


def is_loopback(url: str | None) -> bool:
    """An endpoint on this machine: a local twin's."""
    return urlparse(url or "").hostname in LOOPBACK


def local_session(region: str | None = None) -> Any:
    """A boto3 session for a local twin, which takes any credentials."""
    return boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local",
        region_name=region or "us-east-1",
    )  # fmt: skip


def local_twin_class() -> type[LocalTwin]:
    """The local twin, or MissingExtra naming `trialbox[local]` when it is not installed."""
    try:
        from trialbox.local.twin import LocalTwin
    except ImportError as exc:
        raise MissingExtra("the local twin", "local", exc.name) from None
    return LocalTwin


class AsyncClient:
    """Submit execution requests and receive their typed results, on asyncio.

    Configuration: the `resources` argument, else the TRIALBOX_* environment
    (`trialbox.settings.ClientSettings`); `from_stack` reads a deployed stack's outputs and
    `local` starts a local twin.
    """

    def __init__(
        self,
        resources: Resources | None = None,
        *,
        endpoint_url: str | None = None,
        session: Any = None,
        concurrency: int | None = None,
        twin: LocalTwin | None = None,
    ) -> None:
        arguments(ClientArguments, concurrency=concurrency, endpoint_url=endpoint_url)
        if resources is None:  # the environment form: a stack's name, or its resources' names
            settings = ClientSettings.from_env()
            if settings.stack:
                resources, session = stack_resources(settings.stack, None, session)
            else:
                resources = Resources.from_settings(settings)
            endpoint_url = endpoint_url or settings.endpoint_url
        self.endpoint_url = endpoint_url
        self.resources = resources
        self._twin = twin
        self.concurrency = concurrency or default_concurrency(self.capacity)
        self._aws = Aws(session or boto3.session.Session(), self.endpoint_url, self.resources)
        self._waiting: deque[AsyncHandle] = deque()  # admitted by the client, not yet sent
        self._in_flight: dict[str, AsyncHandle] = {}  # sent, no result yet
        self._open: dict[str, AsyncHandle] = {}  # every unresolved handle, by request id
        self._pushed: dict[bytes, TaskSetRef] = {}  # task sets built in code, by content
        self._pump: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._poll_failures = 0
        self._send_failures = 0
        self._polled_at = -math.inf  # time.monotonic() of the last poll (-inf: poll next round)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sessions = SessionContext(self._aws, self._grade)

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_stack(
        cls,
        name: str,
        *,
        region: str | None = None,
        session: Any = None,
        concurrency: int | None = None,
    ) -> Self:
        """The deployed stack `name`, its resources read from its CloudFormation outputs."""
        resources, session = stack_resources(name, region, session)
        return cls(resources, session=session, concurrency=concurrency)

    @classmethod
    def local(cls, workers: int = 2, *, concurrency: int | None = None) -> Self:
        """A local twin on this machine (moto and bwrap sandboxes), stopped with the client.
        Starting it takes a few seconds, and blocks."""
        twin = local_twin_class()(workers=workers).start()
        session = local_session()
        try:
            return cls(
                Resources.from_outputs(twin.outputs),
                endpoint_url=twin.endpoint_url,
                session=session,
                concurrency=concurrency,
                twin=twin,
            )
        except BaseException:
            twin.stop()
            raise

    @property
    def capacity(self) -> int | None:
        """Jobs the pool runs at once, when known: the twin's workers, or the stack's pool."""
        return self._twin.workers if self._twin is not None else self.resources.capacity

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called: a closed client sends nothing more."""
        return self._closed

    @property
    def is_local(self) -> bool:
        """A local twin (in-process, or `trialbox local up` on this machine), whose S3 and
        table end when it stops."""
        return self._twin is not None or is_loopback(self.endpoint_url)

    # --- task sets -----------------------------------------------------------------------------

    async def push_taskset(self, path: str | Path) -> TaskSetRef:
        """Upload a tasks.jsonl file, content-addressed: `ref.task(task_id)` names a task."""
        path = Path(path)
        body = await asyncio.to_thread(path.read_bytes)
        return await self._push(path.stem, body)

    async def push_tasks(self, tasks: Sequence[TaskInput], name: str = "tasks") -> TaskSetRef:
        """Upload tasks built in code (each a Task or its JSON as a dict) as a task set (once
        per content, per client). A bad task is an InputError naming it and its field."""
        name = arguments(PushArguments, name=name).name
        return await self._push(name, tasks_body(as_tasks(tasks)))

    async def _push(self, name: str, body: bytes) -> TaskSetRef:
        if body not in self._pushed:
            ref = taskset_ref(name, body)
            await asyncio.to_thread(
                self._aws.put_taskset, keys.taskset_key(ref.name, ref.version), body
            )
            self._pushed[body] = ref
        return self._pushed[body]

    # --- submitting and waiting ------------------------------------------------------------------

    async def submit(self, requests: Sequence[RequestInput]) -> list[AsyncHandle]:
        """One handle per request (an ExecutionRequest or its JSON as a dict), at once. A
        request whose result the pipeline already holds (the same id and content) resolves
        without running again; an id already used for other content raises RequestIdReused
        naming it, and nothing of this call is submitted. A bad request is an InputError
        naming it and its field."""
        self._check_open()
        self._check_loop()
        requests = as_requests(requests)
        hashes = [r.content_sha256() for r in requests]
        fresh: dict[str, AsyncHandle] = {}
        handles: list[AsyncHandle] = []
        for request, content in zip(requests, hashes, strict=True):
            rid = request.request_id
            known = fresh.get(rid) or self._open.get(rid)
            if known is not None and known.content_sha256 != content:
                raise RequestIdReused(rid)
            if known is None:
                known = fresh[rid] = AsyncHandle(request, content)
            handles.append(known)
        # Open before the table is read: a concurrent submit of the same id joins these.
        self._open.update(fresh)
        try:
            stored = await asyncio.to_thread(self._aws.results, list(fresh))
            reused = [
                rid for rid, (_, content) in stored.items()
                if content not in (None, fresh[rid].content_sha256)
            ]  # fmt: skip
            if reused:
                raise RequestIdReused(reused[0])
        except BaseException as exc:  # nothing of this call is submitted
            for handle in fresh.values():
                self._finish(
                    handle,
                    exc if isinstance(exc, TrialboxError) else ClientClosed(handle.request_id),
                )
            raise
        for rid, handle in fresh.items():
            if rid in stored:
                self._finish(handle, stored[rid][0])
            else:
                self._waiting.append(handle)
        self._kick()
        return handles

    async def as_completed(
        self, handles: Sequence[AsyncHandle], timeout: float | None = None
    ) -> AsyncIterator[AsyncHandle]:
        """Each handle as its result arrives. Raises WaitTimeout (with the ids left) when
        `timeout` seconds pass first."""
        pending = {h.future: h for h in handles}
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise WaitTimeout([h.request_id for h in pending.values()], timeout or 0)
            for future in sorted(done, key=lambda f: pending[f].finished_at or 0):
                yield pending.pop(future)

    async def gather(
        self, handles: Sequence[AsyncHandle], timeout: float | None = None
    ) -> list[ExecutionResult]:
        """Every result, in the handles' order. Raises WaitTimeout (with the ids left)."""
        async for _ in self.as_completed(handles, timeout):
            pass
        return [h.future.result() for h in handles]

    async def run(
        self, requests: Sequence[RequestInput], timeout: float | None = None
    ) -> list[ExecutionResult]:
        """Submit, then gather: every request to its terminal result, in order."""
        return await self.gather(await self.submit(requests), timeout)

    async def cancel(self, handles: Sequence[AsyncHandle]) -> None:
        """End each unfinished request with the terminal status `cancelled` (reward None,
        loss_mask true). One not yet sent never reaches the pipeline; one in flight gets its
        `cancelled` result recorded (a result recorded first stands, and the handle gets it)
        and its execution stopped, which frees its sandbox."""
        self._check_loop()
        mine = [h for h in handles if not h.done() and self._open.get(h.request_id) is h]
        for handle in mine:  # the unsent first, without a pause: none of them is sent now
            if not handle.sent:
                self._finish(handle, _cancelled(handle))
        limit = asyncio.Semaphore(CANCELS_AT_ONCE)

        async def stop(handle: AsyncHandle) -> None:
            async with limit:
                result = _cancelled(handle)
                if await asyncio.to_thread(self._aws.cancel, result, handle.content_sha256):
                    self._finish(handle, result)

        await asyncio.gather(*(stop(h) for h in mine if not h.done()))
        self._polled_at = -math.inf  # a result that beat the cancel is read now
        self._kick()

    async def withdraw(self, handles: Sequence[AsyncHandle]) -> list[AsyncHandle]:
        """Cancel the handles not yet sent, and only those (nothing reached the pipeline for
        them); returns them. `trialbox run` does this when interrupted."""
        unsent = [h for h in handles if not h.done() and not h.sent]
        await self.cancel(unsent)
        return unsent

    async def run_group(
        self,
        task: TaskInput,
        completions: Sequence[str],
        extract: groups.Extract = groups.extract_code,
        *,
        group_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ExecutionResult]:
        """GRPO: N completions for one task -> N graded results, in order. `task` is an
        inline Task or its JSON as a dict (pushed once per content), or a pushed task's ref
        (`ref.task(task_id)`).
        Each completion's code (`extract`) goes into the task's starter file; a completion
        with no code scores 0.0 with the flag `no_code`, without a sandbox. The default
        `group_id` hashes the task and the submitted files, so the same group runs once: pass
        a `group_id` to grade it anew (after a cancel, say)."""
        args = _group_arguments(completions, extract, group_id, timeout)
        planned = await self._submit_group(task, args.completions, args.extract, args.group_id)
        await self.gather([p for p in planned if isinstance(p, AsyncHandle)], args.timeout)
        return [p if isinstance(p, ExecutionResult) else p.future.result() for p in planned]

    async def _submit_group(
        self,
        task: TaskInput,
        completions: Sequence[str],
        extract: groups.Extract,
        group_id: str | None,
    ) -> list[AsyncHandle | ExecutionResult]:
        """Per completion, in order: the handle of its request, or its result (no code)."""
        args = _group_arguments(completions, extract, group_id)
        task, task_ref = await self.resolve_task(task)
        plan = await asyncio.to_thread(  # extraction may be slow: never on the loop
            groups.plan, task, task_ref, args.completions, args.extract, args.group_id
        )
        handles = await self.submit([p for p in plan if isinstance(p, ExecutionRequest)])
        by_id = {h.request_id: h for h in handles}
        return [p if isinstance(p, ExecutionResult) else by_id[p.request_id] for p in plan]

    async def resolve_task(self, task: TaskInput) -> tuple[Task, str]:
        """The task and its ref: a ref's task read from its task set (once per task set), or
        an inline task (a Task or its JSON as a dict) pushed (once per content). A bad task is
        an InputError naming its field; a ref naming no task raises SessionError."""
        self._check_open()
        read = task_or_ref(task)
        if isinstance(read, str):
            return await self.sessions.io.task(read), read
        ref = await self.push_tasks([read], name=f"group-{read.task_id}")
        return read, ref.task(read.task_id)

    # --- sessions ----------------------------------------------------------------------------

    def session(
        self,
        task: TaskInput,
        *,
        run_id: str | None = None,
        episode_id: str | None = None,
        tags: dict[str, str] | None = None,
        limits: LimitOverrides | dict[str, Any] | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        idle_release_s: float = DEFAULT_IDLE_RELEASE_S,
        files: dict[str, FileContent] | None = None,
    ) -> SessionOpening:
        """A session on `task` (a task ref, `ref.task(task_id)`, an inline Task, or its JSON
        as a dict): use with `async with`, or `await` it. Its hidden tests reach only
        `grade()`. A bad task or argument is an InputError here, at the call."""
        self._check_open()
        read = task_or_ref(task)
        args = arguments(
            SessionArguments, run_id=run_id, episode_id=episode_id, tags=tags, limits=limits,
            ttl_s=ttl_s, idle_release_s=idle_release_s, files=files,
        )  # fmt: skip
        return SessionOpening(
            self.sessions, read, args.run_id, args.episode_id, args.tags or {},
            args.limits or LimitOverrides(), args.ttl_s, args.idle_release_s, args.files,
        )  # fmt: skip

    async def _grade(self, request: ExecutionRequest, timeout: float | None) -> ExecutionResult:
        (result,) = await self.run([request], timeout)
        return result

    @property
    def region(self) -> str:
        """The AWS region the client calls."""
        return str(self._aws.session.region_name)

    async def read_object(self, uri: str) -> bytes:
        """An `s3://bucket/key` object: a trace or a report."""
        return await asyncio.to_thread(self._aws.read_object, uri)

    # --- the pump -----------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        """Send and poll until nothing is open. Should it fail, every open handle fails with
        the error: none is left waiting forever."""
        try:
            await self._pump_loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("the client's pump failed")
            if not isinstance(exc, TrialboxError):
                exc = TrialboxError(f"the client failed: {type(exc).__name__}: {exc}")
            for handle in list(self._open.values()):
                self._finish(handle, exc)
            self._waiting.clear()

    async def _pump_loop(self) -> None:
        assert self._wake is not None
        delay = POLL_S
        while (self._waiting or self._in_flight) and not self._closed:
            self._wake.clear()
            # Poll first: the slots it frees are refilled at once, and each poll comes a full
            # delay after the sends it covers. A submit's wake-up sends at once but polls no
            # sooner than POLL_S after the last poll (submits one at a time would each cost
            # a poll), and a poll it skips keeps its time; a cancel's polls at once (a result
            # that beat the cancel is read now).
            polled = time.monotonic() - self._polled_at >= POLL_S
            arrived = await self._poll() if polled else 0
            sent = await self._admit()
            if sent or arrived:
                delay = POLL_S
            elif polled:
                delay = min(MAX_POLL_S, delay * 1.5)
            skipped = not (polled or sent)  # the next poll keeps its time
            wait = max(0.0, self._polled_at + delay - time.monotonic()) if skipped else delay
            if self._waiting or self._in_flight:
                # asyncio.wait, not wait_for: on 3.11 wait_for loses a cancel (aclose) that
                # arrives as the wake-up does.
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({woken}, timeout=wait)
                finally:
                    woken.cancel()

    async def _admit(self) -> int:
        batch: list[AsyncHandle] = []
        while self._waiting and len(self._in_flight) + len(batch) < self.concurrency:
            handle = self._waiting.popleft()
            if not handle.done():  # cancelled while it waited
                batch.append(handle)
        if not batch:
            return 0
        for handle in batch:  # in flight before the call: an interrupted call may have sent it
            handle.sent_at = time.monotonic()
            self._in_flight[handle.request_id] = handle
        sent = await asyncio.to_thread(lambda: self._aws.send(self._bodies(batch)))
        for rid, reason in sent.refused.items():
            refused = AwsCallError(f"SendMessageBatch refused {rid} ({reason}): it was not sent")
            self._finish(self._in_flight[rid], refused)
        for rid in reversed(sent.unattempted):  # back to the front, sent again next round
            handle = self._in_flight.pop(rid)
            handle.sent_at = None
            self._waiting.appendleft(handle)
        if sent.error is not None:
            self._send_failures += 1
            log.warning("sending failed (%d in a row): %s", self._send_failures, sent.error)
            if self._send_failures >= MAX_CALL_FAILURES:
                raise sent.error  # every open handle fails with it
        else:
            self._send_failures = 0
        return len(batch) - len(sent.unattempted)

    def _bodies(self, batch: list[AsyncHandle]) -> list[tuple[str, str]]:
        """The message bodies; a request that cannot be sent fails alone, saying why."""
        bodies = []
        for handle in batch:
            try:
                body = self._aws.message_body(handle.request, handle.content_sha256)
            except (TrialboxError, ValueError) as exc:
                self._loop_call(self._finish, handle, _unsendable(handle.request_id, exc))
                continue
            bodies.append((handle.request_id, body))
        return bodies

    async def _poll(self) -> int:
        if not self._in_flight:
            return 0
        self._polled_at = time.monotonic()
        try:
            stored = await asyncio.to_thread(self._aws.results, list(self._in_flight))
        except TrialboxError as exc:  # botocore retried already
            self._poll_failures += 1
            log.warning("polling results failed (%d in a row): %s", self._poll_failures, exc)
            if self._poll_failures >= MAX_CALL_FAILURES:  # the requests in flight still run
                self._poll_failures = 0
                for handle in list(self._in_flight.values()):
                    self._finish(handle, TrialboxError(
                        f"the result of {handle.request_id} cannot be read ({exc}); the "
                        "request still runs: submit it again to collect its result"
                    ))  # fmt: skip
            return 0
        self._poll_failures = 0
        for rid, (result, content) in stored.items():
            arrived = self._in_flight.get(rid)
            if arrived is None:
                continue
            if content not in (None, arrived.content_sha256):
                self._finish(arrived, RequestIdReused(rid))
            else:
                self._finish(arrived, result)
        return len(stored)

    def _loop_call(self, fn: Any, *args: Any) -> None:
        """Call `fn` on the client's loop from a worker thread."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    def _check_loop(self) -> None:
        """One client, one event loop: its handles and pump belong to the loop it met first."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise TrialboxError(
                "this AsyncClient is used from a second event loop; make one client per loop "
                "(or use the blocking Client from any thread)"
            )

    def _finish(self, handle: AsyncHandle, outcome: ExecutionResult | BaseException) -> None:
        self._in_flight.pop(handle.request_id, None)
        self._open.pop(handle.request_id, None)
        handle.resolve(outcome)

    # --- closing ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TrialboxError("the client is closed")

    async def aclose(self) -> None:
        """Stop the pump; unresolved handles raise ClientClosed (a sent request still runs);
        a local twin stops."""
        self._closed = True
        # Their workers free the slots at once; together: each may wait out a lost worker.
        closing = [session.close() for session in list(self.sessions.open)]
        outcomes = await asyncio.gather(*closing, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        await self.sessions.close()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for handle in list(self._open.values()):
            handle.resolve(ClientClosed(handle.request_id))
        self._open.clear()
        self._waiting.clear()
        self._in_flight.clear()
        if self._twin is not None:
            twin, self._twin = self._twin, None
            await asyncio.to_thread(twin.stop)
        if failed:  # the rest closed first
            raise failed[0]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _cancelled(handle: AsyncHandle) -> ExecutionResult:
    return result_for(
        handle.request_id,
        Status.CANCELLED,
        error="cancelled by the client",
        task_id=handle.request.task_id,
        sample_id=handle.request.sample_id,
    )


def _unsendable(request_id: str, exc: Exception) -> TrialboxError:
    return TrialboxError(f"request {request_id} cannot be sent: {exc}")


def _group_arguments(
    completions: object, extract: object, group_id: object, timeout: object = None
) -> GroupArguments:
    if isinstance(completions, str):  # never one sample per character
        raise InputError("completions: a list of completions (str), not one string")
    return arguments(
        GroupArguments,
        completions=completions,
        extract=extract,
        group_id=group_id,
        timeout=timeout,
    )


class SessionOpening:
    """What `AsyncClient.session(...)` returns: awaitable (an open session) and an async
    context manager (closed at exit)."""

    def __init__(
        self,
        context: SessionContext,
        task: Task | str,
        run_id: str | None,
        episode_id: str | None,
        tags: dict[str, str],
        limits: LimitOverrides,
        ttl_s: float,
        idle_release_s: float,
        files: dict[str, FileContent] | None,
    ) -> None:
        self._args = (context, task, run_id, episode_id, tags, limits, ttl_s, idle_release_s, files)
        self._session: AsyncSession | None = None

    async def open(self) -> AsyncSession:
        context, task, run_id, episode_id, tags, limits, ttl_s, idle_release_s, files = self._args
        if isinstance(task, str):
            task_ref: str | None = task
            resolved = await context.io.task(task)
        else:
            task_ref, resolved = None, task
        session = AsyncSession(
            context, resolved, task_ref, limits=limits, ttl_s=ttl_s,
            idle_release_s=idle_release_s, run_id=run_id, episode_id=episode_id, tags=tags,
            files=files,
        )  # fmt: skip
        await session.open()
        context.track(session)
        self._session = session
        return session

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self.open().__await__()

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
