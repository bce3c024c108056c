"""What the adapters share: a picklable connection, tasks named by a dataset's cell, the model's
tool arguments checked, completions as text, and rewards with the platform's failures left out
(None, never 0)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field, StrictInt, TypeAdapter, ValidationError

from trialbox.errors import InputError, SessionError, TrialboxError
from trialbox.models import ExecutionResult, Task
from trialbox.models.common import StrictModel
from trialbox.models.iomatch import IoSpec
from trialbox.models.sample import Argv
from trialbox.models.sessions import MAX_TTL_S
from trialbox.pipeline.record import validation_message
from trialbox.sdk import AsyncClient, Client, Resources
from trialbox.sdk.core import is_loopback, local_session
from trialbox.sdk.extract import Extract, extract_code
from trialbox.sdk.handles import AsyncHandle
from trialbox.sdk.inputs import TaskInput, located, task_or_ref
from trialbox.settings import ClientSettings

log = logging.getLogger("trialbox.integrations")

TaskCell = TaskInput
"""A dataset's task cell: a pushed task's ref (`name@version/task_id`), a Task, or its JSON (a
dict, or its text)."""
_ARGV: TypeAdapter[list[str]] = TypeAdapter(Argv)


class AdapterSettings(StrictModel):
    """A trainer's settings for an adapter, read when it is built (never blamed on the
    model at a tool call): `ttl_s` (a session's), `command_timeout_s` (a tool call's),
    `max_turns` (SkyRL's), `timeout` (a reward batch's)."""

    ttl_s: float = Field(default=1800, ge=1, le=MAX_TTL_S, allow_inf_nan=False)
    command_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_turns: StrictInt = Field(default=4, ge=1)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)


def adapter_settings(where: str, **values: Any) -> AdapterSettings:
    """The settings given (None: the default), or InputError naming each bad one."""
    given = {name: value for name, value in values.items() if value is not None}
    try:
        return AdapterSettings.model_validate(given)
    except ValidationError as exc:
        raise InputError(located(exc, where)) from None


@dataclass(frozen=True)
class Connection:
    """Where a deployment is, without a live client: what an adapter pickles. Each process
    connects once (`client()`); a live client given in this process is reused as it is."""

    resources: Resources | None = None
    endpoint_url: str | None = None
    region: str | None = None
    stack: str | None = None  # read the resources from this stack's outputs instead
    concurrency: int | None = None

    @classmethod
    def of(cls, client: Client | AsyncClient | Connection | str | None) -> Connection:
        """From a live client (kept for this process), a stack name, or None (the
        environment: `trialbox local up`'s exports, or TRIALBOX_* set by hand)."""
        if client is None:
            return cls.from_env()
        if isinstance(client, Connection):
            return client
        if isinstance(client, str):
            return cls(stack=client)
        live = client if isinstance(client, Client) else None
        aio = client.aio if isinstance(client, Client) else client
        if not isinstance(aio, AsyncClient):
            raise InputError(
                f"expected a trialbox Client, a stack name or None, got {type(client).__name__}"
            )
        connection = cls(
            resources=aio.resources,
            endpoint_url=aio.endpoint_url,
            region=aio.region,
            concurrency=aio.concurrency,
        )
        if live is not None and not live.closed:
            with _lock:
                kept = _clients.get((os.getpid(), connection))
                if kept is None or kept.closed:
                    _clients[(os.getpid(), connection)] = live
        return connection

    @classmethod
    def from_env(cls) -> Connection:
        """The process's environment: a stack named by TRIALBOX_STACK, else the TRIALBOX_*
        resource names (`trialbox local up` prints them)."""
        settings = ClientSettings.from_env()
        if settings.stack:
            return cls(stack=settings.stack)
        return cls(resources=Resources.from_settings(settings), endpoint_url=settings.endpoint_url)

    def connect(self) -> Client:
        if self.stack is not None:
            return Client.from_stack(self.stack, region=self.region, concurrency=self.concurrency)
        session = boto3.session.Session(region_name=self.region)
        if is_loopback(self.endpoint_url) and session.get_credentials() is None:
            session = local_session(self.region)
        return Client(
            self.resources,
            endpoint_url=self.endpoint_url,
            session=session,
            concurrency=self.concurrency,
        )

    def client(self) -> Client:
        """This process's client for the connection (made on first use, thread-safe); a
        client closed since (by its owner) is never used: another is made."""
        key = (os.getpid(), self)
        with _lock:
            kept = _clients.get(key)
            if kept is None or kept.closed:
                kept = _clients[key] = self.connect()
            return kept


_clients: dict[tuple[int, Connection], Client] = {}
_lock = threading.Lock()


def task_of(cell: object, column: str) -> Task | str:
    """A task cell as `run_group` and sessions take it (the SDK's reading, with a task's JSON
    text decoded first), or InputError naming the column and the field."""
    if isinstance(cell, str) and cell.lstrip().startswith("{"):
        try:
            cell = json.loads(cell)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"column {column!r}: the task's JSON does not parse: {exc}") from None
    return task_or_ref(cell, f"column {column!r}")


def mapping_of(value: object, what: str) -> Mapping[str, Any]:
    """A row's dict field (None: empty), or InputError naming it: a trainer's data."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{what}: expected a dict, got {type(value).__name__}")
    return value


class BadToolCall(ValueError):
    """A tool call whose arguments cannot run; its text is for the model to read."""


def tool_argv(prefix: Sequence[str], source: object, what: str) -> list[str]:
    """The command that runs the model's `source` (`prefix` + source: `bash -c ...`), checked
    as a session checks it; BadToolCall saying why when it cannot run (a wrong type, a NUL, a
    lone surrogate, over the kernel's argument limits). The model wrote it: never the
    trainer's error, and nothing is sent."""
    if not isinstance(source, str):
        given = "nothing" if source is None else f"a {type(source).__name__}"
        raise BadToolCall(f"{what} cannot run: give it as a string, not {given}")
    try:
        return _ARGV.validate_python([*prefix, source])
    except ValidationError as exc:
        reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise BadToolCall(f"{what} cannot run: {reasons}") from None


def task_or_cases(cell: object, column: str) -> Task | str:
    """A cell that holds a task (as `task_of`) or test cases (as `io_task`), as verl's and
    SkyRL's code datasets put test cases in their ground truth."""
    parsed = cell  # decoded once: a ground truth's cases may be megabytes of JSON
    if isinstance(cell, str | bytes):
        with contextlib.suppress(ValueError, RecursionError):  # then read as a task cell
            parsed = json.loads(cell)
    if isinstance(parsed, list) or (
        isinstance(parsed, Mapping) and ("inputs" in parsed or "cases" in parsed)
    ):
        return io_task(parsed)
    return task_of(parsed if isinstance(parsed, Mapping) else cell, column)


def io_task(cases: object, *, task_id: str | None = None, **io: Any) -> Task:
    """An inline `io_match` task from test cases, as code datasets store them:
    `{"inputs": [...], "outputs": [...]}` (APPS, verl's code sets; with `fn_name`, a
    call-based problem), `{"cases": [...]}`, a list of `{"input", "output"}`, or the JSON text
    of any of these. The program is `solution.py`."""
    try:
        raw = json.loads(cases) if isinstance(cases, str | bytes) else cases
    except (ValueError, RecursionError) as exc:
        raise InputError(f"test cases: not JSON ({exc})") from None
    if isinstance(raw, list):
        raw = {"cases": raw}
    if not isinstance(raw, Mapping):
        raise InputError(f"test cases must be a JSON object or list, got {type(raw).__name__}")
    # A dataset's row may carry more (time_limit, memory_limit, ...): only the cases are read.
    known = IoSpec.model_fields.keys() | {"inputs", "outputs"}
    raw = {k: v for k, v in raw.items() if k in known}
    try:
        spec = IoSpec.model_validate(raw | io)
        digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()  # the same cases
        return Task.model_validate(
            {
                "task_id": task_id or f"io-{digest[:16]}",
                "workspace": {"solution.py": ""},
                "grading": {"scorer": "io_match", "io": spec.model_dump()},
            }
        )
    except ValidationError as exc:
        raise InputError(f"test cases: {validation_message(exc)}") from None


def completion_text(completion: object) -> str:
    """A completion as text. TRL's conversational form (a list of messages) is the content of
    its last assistant message (text parts joined). Anything else is no text: the sample's
    0.0 (`no_code`), never the batch's error."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        messages = [m for m in completion if isinstance(m, Mapping)]
        said = [m for m in messages if m.get("role") == "assistant"] or messages
        return _content_text(said[-1].get("content")) if said else ""
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def rewards(results: Sequence[ExecutionResult], mask_group: bool = False) -> list[float | None]:
    """Each result's `reward_or_none`; with `mask_group`, every reward of a group is None when
    any of its samples failed on the platform (its mean and std would be biased)."""
    if mask_group and any(r.loss_mask for r in results):
        return [None] * len(results)
    return [r.reward_or_none for r in results]


def is_infrastructure_failure(exc: BaseException) -> bool:
    """An error that says nothing about the policy: its samples get None. Input errors (a bad
    task cell, an extract function that fails, a task ref naming no task) are the trainer's,
    and raise."""
    if isinstance(exc, InputError | SessionError):
        return False
    return isinstance(exc, TrialboxError | BotoCoreError | ClientError | OSError)


@dataclass
class Graded:
    """A batch's outcome: a reward (or None) per sample, and counts for the trainer's log."""

    rewards: list[float | None]
    counts: Counter[str]

    @classmethod
    def failed(cls, n: int) -> Graded:
        """n samples the platform failed, with no result at all."""
        return cls([None] * n, Counter(infrastructure_failed=n))

    def metrics(self) -> dict[str, float]:
        """Fractions of the batch, per status (`infrastructure_failed`: no result at all) and
        `masked` (reward None)."""
        total = max(1, len(self.rewards))
        out = {f"trialbox/{status}": n / total for status, n in sorted(self.counts.items())}
        out["trialbox/masked"] = sum(r is None for r in self.rewards) / total
        return out


async def grade_groups(
    client: AsyncClient,
    groups: Sequence[tuple[TaskInput, Sequence[str]]],
    extract: Extract = extract_code,
    *,
    mask_group: bool = False,
    timeout: float | None = None,
) -> list[Graded]:
    """Each (task, completions) group graded concurrently. A group the platform fails as a
    whole (the deployment unreachable) is None for each sample, never 0. `timeout` is the
    batch's: a sample without a result by then is cancelled (None, as any `cancelled`), and
    the results that arrived stand."""
    resolved = await asyncio.gather(*(client.resolve_task(task) for task, _ in groups))
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    outcomes = await asyncio.gather(
        *(
            _graded_group(client, ref, completions, extract, deadline)
            for (_, ref), (_, completions) in zip(resolved, groups, strict=True)
        ),
        return_exceptions=True,
    )
    graded = []
    for outcome, (_, completions) in zip(outcomes, groups, strict=True):
        if isinstance(outcome, BaseException):
            if not is_infrastructure_failure(outcome):
                raise outcome
            log.warning("a group of %d failed on the platform: %s", len(completions), outcome)
            graded.append(Graded.failed(len(completions)))
        else:
            counts = Counter(r.status.value for r in outcome)
            graded.append(Graded(rewards(outcome, mask_group), counts))
    return graded


async def _graded_group(
    client: AsyncClient,
    task: str,
    completions: Sequence[str],
    extract: Extract,
    deadline: float | None,
) -> list[ExecutionResult]:
    """A group's results; one still running at `deadline` (loop time) is cancelled: the slow
    sample is left out alone, never the group's finished ones with it."""
    planned = await client._submit_group(task, completions, extract, None)
    handles = [p for p in planned if isinstance(p, AsyncHandle)]
    if handles:
        left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        _, late = await asyncio.wait([h.future for h in handles], timeout=left)
        if late:
            await client.cancel([h for h in handles if h.future in late])
            await asyncio.wait(late)  # each ends: its result, or `cancelled`
    return [p if isinstance(p, ExecutionResult) else p.future.result() for p in planned]
