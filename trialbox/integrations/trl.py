"""TRL (trl==1.16.0): a reward function for GRPOTrainer, and an environment factory for its
multi-turn tool loop. Neither imports TRL: they follow the signatures it calls.

    reward = TrialboxReward(Client.from_stack("trialbox"), task_column="task_ref")
    trainer = GRPOTrainer(model, reward_funcs=[reward], train_dataset=dataset, ...)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from trialbox.errors import InputError, SessionError
from trialbox.integrations.common import (
    BadToolCall,
    Connection,
    Graded,
    TaskCell,
    adapter_settings,
    completion_text,
    grade_groups,
    is_infrastructure_failure,
    task_of,
    tool_argv,
)
from trialbox.models import ExecutionResult, Task
from trialbox.sdk import AsyncClient, Client
from trialbox.sdk.extract import Extract, extract_code
from trialbox.sdk.sessions import AsyncSession

__all__ = ["TrialboxEnvironment", "TrialboxReward", "environment_factory"]

log = logging.getLogger("trialbox.integrations.trl")


class TrialboxReward:
    """A TRL reward function: each completion graded against the task in its row's
    `task_column`, as GRPO groups run concurrently. Returns `reward_or_none` per completion:
    a sample the platform failed is None (TRL leaves it out of the group's mean and std),
    never 0. With `mask_failed_groups`, the whole group of such a sample is None.

    Picklable (AsyncGRPOTrainer scores in a spawned child): it carries the client's
    connection settings, and each process connects once. Its `__call__` is synchronous and
    thread-safe; `trainer_state`, `log_metric` and `log_extra` are optional."""

    def __init__(
        self,
        client: Client | AsyncClient | Connection | str | None = None,
        task_column: str = "task_ref",
        extract: Extract = extract_code,
        *,
        mask_failed_groups: bool = False,
        timeout: float | None = None,
        name: str = "trialbox",
    ) -> None:
        self.timeout = adapter_settings("", timeout=timeout).timeout
        self.connection = Connection.of(client)
        self.task_column = task_column
        self.extract = extract
        self.mask_failed_groups = mask_failed_groups
        self.__name__ = name  # TRL names a function's reward column by it

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        completion_ids: Any = None,
        *,
        trainer_state: Any = None,
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list[Any]], None] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        if self.task_column not in columns:
            raise InputError(
                f"the dataset has no column {self.task_column!r} naming each row's task "
                f"(its columns here: {sorted(columns) or 'none'}); pass task_column="
            )
        completions = _batch(completions, "completions")
        cells = _batch(columns[self.task_column], f"column {self.task_column!r}")
        if len(cells) != len(completions):
            raise InputError(f"{len(completions)} completions but {len(cells)} task cells")
        if prompts is not None and len(prompts) != len(completions):
            raise InputError(f"{len(completions)} completions but {len(prompts)} prompts")
        texts = [completion_text(c) for c in completions]
        groups = self._groups(cells, prompts, texts)
        client = self.connection.client()
        grading = grade_groups(
            client.aio,
            [(task, completions) for task, completions, _ in groups],
            self.extract,
            mask_group=self.mask_failed_groups,
            timeout=self.timeout,
        )
        try:
            graded = client.schedule(grading).result()
        except Exception as exc:
            if not is_infrastructure_failure(exc):
                raise
            log.warning("the batch failed on the platform: %s", exc)
            graded = [Graded.failed(len(indices)) for _, _, indices in groups]
        out: list[float | None] = [None] * len(texts)
        total = Graded([], Counter())
        for group, (_, _, indices) in zip(graded, groups, strict=True):
            for index, reward in zip(indices, group.rewards, strict=True):
                out[index] = reward
            total.rewards += group.rewards
            total.counts.update(group.counts)
        if log_metric is not None:
            for name, value in total.metrics().items():
                log_metric(name, value)
        return out

    def _groups(
        self, cells: Sequence[TaskCell], prompts: Sequence[Any] | None, texts: list[str]
    ) -> list[tuple[Task | str, list[str], list[int]]]:
        """Completions of the same task and prompt form a group (TRL's generations of one
        prompt), in first-seen order."""
        groups: dict[str, tuple[Task | str, list[str], list[int]]] = {}
        tasks: dict[str, Task | str] = {}  # each distinct cell read once, not per generation
        for index, cell in enumerate(cells):
            cell_key = cell if isinstance(cell, str) else repr(cell)
            if cell_key not in tasks:
                tasks[cell_key] = task_of(cell, self.task_column)
            task = tasks[cell_key]
            key = cell_key + "\0" + repr(prompts[index] if prompts is not None else "")
            entry = groups.setdefault(key, (task, [], []))
            entry[1].append(texts[index])
            entry[2].append(index)
        return list(groups.values())


def _batch(values: object, what: str) -> list[Any]:
    """A batch's column as a list (any iterable, read once); InputError naming it else."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise InputError(f"{what}: expected a list (one per sample), got {type(values).__name__}")
    return list(values)


class TrialboxEnvironment:
    """One TRL environment: a Trialbox session per episode. TRL pools instances and calls
    `reset(**row)` for each rollout; every public method but `reset` and `get_reward` is a
    tool (here `bash` and `run_python`), and `get_reward()` grades the episode.

    `reset` returns at once: the session opens on the client's loop while the batch goes on,
    and the first tool call waits for it. The previous episode's session is closed, and every
    session has a TTL, so a pooled instance the trainer drops holds nothing for long. The
    first `get_reward` of a batch starts the grading of every episode of its factory, so the
    batch's grades run concurrently although TRL asks for them one by one."""

    def __init__(
        self,
        connection: Connection,
        task_column: str,
        ttl_s: float,
        command_timeout_s: float | None,
        peers: list[TrialboxEnvironment],
    ) -> None:
        self._connection = connection
        self._task_column = task_column
        self._ttl_s = ttl_s
        self._timeout_s = command_timeout_s
        self._peers = peers
        self._opening: concurrent.futures.Future[AsyncSession] | None = None
        self._graded: concurrent.futures.Future[ExecutionResult] | None = None
        peers.append(self)

    def reset(self, **row: Any) -> str | None:
        if self._task_column not in row:
            raise InputError(
                f"the dataset row has no column {self._task_column!r} naming its task "
                f"(its columns: {sorted(row)})"
            )
        task = task_of(row[self._task_column], self._task_column)
        self._end()
        client = self._connection.client()
        self._opening = client.schedule(client.aio.session(task, ttl_s=self._ttl_s).open())
        self._graded = None
        return None

    def bash(self, command: str) -> str:
        """Run a shell command in the task's workspace (its files, where the answer goes) and
        return what it printed and its exit code.

        Args:
            command: The bash command line to run.
        """
        return self._run(["bash", "-c"], command, "the `command` argument")

    def run_python(self, code: str) -> str:
        """Run Python code in the task's workspace and return what it printed and its exit
        code.

        Args:
            code: The Python source code to run.
        """
        return self._run(["python", "-c"], code, "the `code` argument")

    def get_reward(self) -> float | None:
        """The episode's grade: its reward, or None when the platform failed it."""
        for peer in self._peers:
            peer._start_grading()
        if self._graded is None:
            raise InputError("get_reward before reset: the environment has no episode")
        try:
            return self._graded.result().reward_or_none
        except Exception as exc:
            if not is_infrastructure_failure(exc):
                raise
            log.warning("grading the episode failed on the platform: %s", exc)
            return None

    # --- internals (private: TRL turns every public method into a tool) ----------------------

    def _run(self, program: list[str], source: object, what: str) -> str:
        """The call's feedback, or an error text: whatever the model passed, a tool answers
        it and never raises (TRL would end the rollout), and arguments that cannot run send
        nothing."""
        if self._opening is None:
            return "error: no episode (reset was not called)"
        if self._graded is not None:
            return "error: the episode is graded; the next reset starts another"
        try:
            argv = tool_argv(program, source, what)
        except BadToolCall as exc:
            return f"error: {exc}"
        try:
            return self._connection.client().schedule(self._step(self._opening, argv)).result()
        except Exception as exc:
            if not is_infrastructure_failure(exc):
                raise
            return f"error: the sandbox failed (not your command): {exc}"

    async def _step(self, opening: concurrent.futures.Future[AsyncSession], argv: list[str]) -> str:
        """The call's feedback. The session's opening fails as the trainer's error (a task
        ref naming no task) or the platform's; this call's own refusal (the session expired
        or closed) is the model's error text."""
        session = await asyncio.wrap_future(opening)
        try:
            called = await session.step(commands=[argv], timeout_s=self._timeout_s)
        except (InputError, SessionError) as exc:
            return f"error: {exc}"
        return called.feedback

    def _start_grading(self) -> None:
        if self._opening is not None and self._graded is None:
            self._graded = self._connection.client().schedule(_grade(self._opening))

    def _end(self) -> None:
        if self._opening is not None and self._graded is None:
            self._connection.client().schedule(_close(self._opening))
        self._opening = self._graded = None


async def _grade(opening: concurrent.futures.Future[AsyncSession]) -> ExecutionResult:
    session = await asyncio.wrap_future(opening)
    try:
        return await session.grade()
    finally:
        await session.close()


async def _close(opening: concurrent.futures.Future[AsyncSession]) -> None:
    try:
        session = await asyncio.wrap_future(opening)
    except Exception:
        return  # it never opened: nothing is held
    await session.close()


def environment_factory(
    client: Client | AsyncClient | Connection | str | None = None,
    task_column: str = "task_ref",
    *,
    ttl_s: float = 900.0,
    command_timeout_s: float | None = None,
) -> Callable[[], TrialboxEnvironment]:
    """TRL's zero-argument `environment_factory`: each call makes a TrialboxEnvironment on
    the client's deployment, whose rows name their task in `task_column`."""
    settings = adapter_settings("", ttl_s=ttl_s, command_timeout_s=command_timeout_s)
    connection = Connection.of(client)
    peers: list[TrialboxEnvironment] = []
    return functools.partial(
        TrialboxEnvironment,
        connection,
        task_column,
        settings.ttl_s,
        settings.command_timeout_s,
        peers,
    )
