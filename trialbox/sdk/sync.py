"""Client: the AsyncClient run on one background event loop, behind blocking methods."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from trialbox.errors import SessionError, TrialboxError, WaitTimeout
from trialbox.models import ExecutionRequest, ExecutionResult, Task
from trialbox.models.common import FileContent
from trialbox.models.limits import LimitOverrides
from trialbox.models.report import CommandResult
from trialbox.models.sessions import CallResult
from trialbox.sdk import groups
from trialbox.sdk.core import (
    DEFAULT_IDLE_RELEASE_S,
    DEFAULT_TTL_S,
    AsyncClient,
    stack_resources,
)
from trialbox.sdk.handles import AsyncHandle
from trialbox.sdk.inputs import RequestInput, TaskInput
from trialbox.sdk.resources import Resources
from trialbox.sdk.sessions import AsyncSession
from trialbox.sdk.tasksets import TaskSetRef

if TYPE_CHECKING:
    from trialbox.local.twin import LocalTwin

T = TypeVar("T")


class LoopThread:
    """One event loop on a daemon thread; coroutines are run on it from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="trialbox")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.schedule(coro).result()

    def schedule(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self.loop.is_closed():  # the client was closed
            coro.close()
            raise TrialboxError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class Handle:
    """A submitted request; `handle.result()` blocks until its terminal result."""

    def __init__(self, inner: AsyncHandle, loop: LoopThread) -> None:
        self._inner = inner
        self._loop = loop
        self.request_id = inner.request_id

    @property
    def request(self) -> ExecutionRequest:
        return self._inner.request

    @property
    def content_sha256(self) -> str:
        return self._inner.content_sha256

    @property
    def submitted_at(self) -> float:
        """time.monotonic() when it was submitted."""
        return self._inner.submitted_at

    @property
    def finished_at(self) -> float | None:
        """time.monotonic() when its result arrived (None: not yet)."""
        return self._inner.finished_at

    @property
    def sent(self) -> bool:
        return self._inner.sent

    @property
    def sent_at(self) -> float | None:
        """time.monotonic() when it was sent (None: not yet)."""
        return self._inner.sent_at

    @property
    def latency_s(self) -> float | None:
        return self._inner.latency_s

    def done(self) -> bool:
        return self._inner.done()

    def result(self, timeout: float | None = None) -> ExecutionResult:
        """The terminal result; raises WaitTimeout when `timeout` seconds pass first."""
        try:
            return self._inner.shared.result(timeout)
        except concurrent.futures.TimeoutError:
            raise WaitTimeout([self.request_id], timeout or 0) from None

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncHandle", "Handle", 1)


class Client:
    """The blocking SDK. Every method is AsyncClient's, run on a background loop: the same
    requests give the same results either way."""

    def __init__(
        self,
        resources: Resources | None = None,
        *,
        endpoint_url: str | None = None,
        session: Any = None,
        concurrency: int | None = None,
        twin: LocalTwin | None = None,
    ) -> None:
        self._start(
            lambda: AsyncClient(
                resources,
                endpoint_url=endpoint_url,
                session=session,
                concurrency=concurrency,
                twin=twin,
            )
        )

    def _start(self, factory: Callable[[], AsyncClient]) -> None:
        self._loop = LoopThread()
        try:
            self._async: AsyncClient = self._loop.run(_build(factory))
        except BaseException:
            self._loop.stop()
            raise

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
        """A local twin on this machine (moto and bwrap sandboxes), stopped with the client."""
        client = cls.__new__(cls)
        client._start(lambda: AsyncClient.local(workers, concurrency=concurrency))
        return client

    @property
    def aio(self) -> AsyncClient:
        """The async client underneath (its coroutines run on this client's loop only)."""
        return self._async

    @property
    def resources(self) -> Resources:
        return self._async.resources

    @property
    def endpoint_url(self) -> str | None:
        return self._async.endpoint_url

    @property
    def capacity(self) -> int | None:
        return self._async.capacity

    @property
    def region(self) -> str:
        """The AWS region the client calls."""
        return self._async.region

    @property
    def concurrency(self) -> int:
        return self._async.concurrency

    @property
    def is_local(self) -> bool:
        return self._async.is_local

    @property
    def closed(self) -> bool:
        """Whether `close` was called: a closed client sends nothing more."""
        return self._async.closed or not self._loop.thread.is_alive()

    def push_taskset(self, path: str | Path) -> TaskSetRef:
        return self._loop.run(self._async.push_taskset(path))

    def push_tasks(self, tasks: Sequence[TaskInput], name: str = "tasks") -> TaskSetRef:
        return self._loop.run(self._async.push_tasks(tasks, name))

    def submit(self, requests: Sequence[RequestInput]) -> list[Handle]:
        return [Handle(h, self._loop) for h in self._loop.run(self._async.submit(requests))]

    def as_completed(
        self, handles: Sequence[Handle], timeout: float | None = None
    ) -> Iterator[Handle]:
        """Each handle as its result arrives; WaitTimeout (with the ids left) after `timeout`."""
        left = {h._inner.shared: h for h in handles}
        try:
            for future in concurrent.futures.as_completed(left, timeout):
                yield left.pop(future)
        except concurrent.futures.TimeoutError:
            raise WaitTimeout([h.request_id for h in left.values()], timeout or 0) from None

    def gather(
        self, handles: Sequence[Handle], timeout: float | None = None
    ) -> list[ExecutionResult]:
        """Every result, in the handles' order. Raises WaitTimeout (with the ids left)."""
        for _ in self.as_completed(handles, timeout):
            pass
        return [h.result() for h in handles]

    def run(
        self, requests: Sequence[RequestInput], timeout: float | None = None
    ) -> list[ExecutionResult]:
        return self._loop.run(self._async.run(requests, timeout))

    def cancel(self, handles: Sequence[Handle]) -> None:
        self._loop.run(self._async.cancel([h._inner for h in handles]))

    def withdraw(self, handles: Sequence[Handle]) -> list[Handle]:
        inner = {id(h._inner): h for h in handles}
        taken = self._loop.run(self._async.withdraw([h._inner for h in handles]))
        return [inner[id(h)] for h in taken]

    def schedule(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine of `aio` on this client's loop, from any thread or event loop:
        its future (`asyncio.wrap_future` awaits it from another loop)."""
        return self._loop.schedule(coro)

    def run_group(
        self,
        task: TaskInput,
        completions: Sequence[str],
        extract: groups.Extract = groups.extract_code,
        *,
        group_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ExecutionResult]:
        return self._loop.run(
            self._async.run_group(task, completions, extract, group_id=group_id, timeout=timeout)
        )

    def resolve_task(self, task: TaskInput) -> tuple[Task, str]:
        return self._loop.run(self._async.resolve_task(task))

    def read_object(self, uri: str) -> bytes:
        return self._loop.run(self._async.read_object(uri))

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
    ) -> Session:
        """An open session (see AsyncClient.session); close it, or use `with`."""
        opening = self._async.session(
            task, run_id=run_id, episode_id=episode_id, tags=tags, limits=limits, ttl_s=ttl_s,
            idle_release_s=idle_release_s, files=files,
        )  # fmt: skip
        return Session(self._loop.run(opening.open()), self._loop)

    def close(self) -> None:
        if self._loop.thread.is_alive():
            self._loop.run(self._async.aclose())
            self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """The blocking face of an AsyncSession: the same calls, run on the client's loop."""

    def __init__(self, inner: AsyncSession, loop: LoopThread) -> None:
        self.aio = inner
        self._loop = loop

    @property
    def session_id(self) -> str:
        return self.aio.session_id

    @property
    def task(self) -> Task:
        return self.aio.task

    @property
    def task_ref(self) -> str | None:
        return self.aio.task_ref

    @property
    def overrides(self) -> LimitOverrides:
        return self.aio.overrides

    @property
    def expires_at(self) -> float:
        """time.time() when the session ends server-side (its TTL)."""
        return self.aio.expires_at

    @property
    def idle_release_s(self) -> float:
        return self.aio.idle_release_s

    @property
    def run_id(self) -> str | None:
        return self.aio.run_id

    @property
    def episode_id(self) -> str | None:
        return self.aio.episode_id

    @property
    def tags(self) -> dict[str, str]:
        return self.aio.tags

    @property
    def seq(self) -> int:
        """Calls answered (or settled by a failover)."""
        return self.aio.seq

    @property
    def closed(self) -> bool:
        return self.aio.closed

    @property
    def checkpoint(self) -> str | None:
        return self.aio.checkpoint

    @property
    def worker(self) -> str | None:
        return self.aio.worker

    @property
    def failovers(self) -> int:
        return self.aio.failovers

    @property
    def epoch(self) -> int:
        """Opens after the first: failovers, and reopens after a release."""
        return self.aio.epoch

    def ttl_left(self) -> float:
        """Seconds until the session ends server-side (its TTL)."""
        return self.aio.ttl_left()

    def step(
        self,
        files: dict[str, FileContent] | None = None,
        commands: Iterable[Sequence[str]] = (),
        timeout_s: float | None = None,
    ) -> CallResult:
        return self._run(self.aio.step(files, commands, timeout_s))

    def exec(
        self, argv: Sequence[str], timeout_s: float | None = None
    ) -> CommandResult | CallResult:
        return self._run(self.aio.exec(argv, timeout_s))

    def write_files(self, files: dict[str, FileContent]) -> CallResult:
        return self._run(self.aio.write_files(files))

    def read_file(self, path: str) -> bytes:
        return self._run(self.aio.read_file(path))

    def fork(self, n: int) -> list[Session]:
        return [Session(s, self._loop) for s in self._run(self.aio.fork(n))]

    def grade(self, timeout: float | None = None) -> ExecutionResult:
        return self._run(self.aio.grade(timeout))

    def close(self) -> None:
        """End the session (see AsyncSession.close). Idempotent, also after the client's
        close (which closed it)."""
        if not self.aio.closed:
            self._loop.run(self.aio.close())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """A call on the client's loop, where the async face says what a closed session
        allows (a grade of its last checkpoint, as long as its client is open); once the
        client's loop is gone with its close, the SessionError the async face raises."""
        if self.aio.closed and self._loop.loop.is_closed():
            coro.close()
            raise SessionError(f"session {self.session_id} is closed")
        return self._loop.run(coro)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _build(factory: Callable[[], AsyncClient]) -> AsyncClient:
    """Construct on the loop's thread (`local` blocks it while the twin starts)."""
    return factory()
