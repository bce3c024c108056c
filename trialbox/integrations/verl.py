"""verl (verl==0.9.1): an async `compute_score` for `reward.custom_reward_function`, and
`TrialboxTool` (trialbox.integrations.verl_tool) for its tool agent loop.

`compute_score` imports nothing of verl; the tool subclasses verl's BaseTool, whose import
pulls in torch and ray. Both reach the deployment the process's environment names (the
TRIALBOX_* variables `trialbox local up` prints, or TRIALBOX_STACK for a deployed stack).

    reward:
      custom_reward_function:
        path: examples/verl_reward.py   # `from trialbox.integrations.verl import compute_score`
        name: compute_score
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from trialbox.errors import InputError
from trialbox.integrations.common import (
    Connection,
    completion_text,
    is_infrastructure_failure,
    log,
    mapping_of,
    task_or_cases,
)
from trialbox.models import ExecutionRequest, ExecutionResult, Task
from trialbox.pipeline.record import validation_message
from trialbox.sdk import Client
from trialbox.sdk.extract import extract_code
from trialbox.sdk.sessions import AsyncSession
from trialbox.sdk.tasksets import request_id

__all__ = [
    "CHECKPOINT_FIELD",
    "SESSION_FIELD",
    "close_session",
    "compute_score",
    "episode_session",
]

# What TrialboxTool writes into `agent_data.extra_fields`; verl merges them into the reward's
# `extra_info`, so that compute_score grades the episode's workspace.
SESSION_FIELD = "trialbox_session"
CHECKPOINT_FIELD = "trialbox_checkpoint"
TASK_FIELD = "trialbox_task"  # in extra_info (or the tool's create_kwargs): the row's task


def task_cell(ground_truth: Any, extra_info: dict[str, Any] | None) -> Task | str:
    """The row's task: `extra_info["trialbox_task"]` if set, else the ground truth (a task
    ref, a task's JSON, or test cases graded as an inline io_match task)."""
    cell = (extra_info or {}).get(TASK_FIELD)
    if cell is not None:
        return task_or_cases(cell, f"extra_info.{TASK_FIELD}")
    if ground_truth is None:
        raise InputError(f"no task: the row has no ground_truth and no extra_info.{TASK_FIELD}")
    return task_or_cases(ground_truth, "reward_model.ground_truth")


async def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """verl's reward function: `{"score": reward, ...}` with the same keys for every sample.

    Without a tool session, the response's code is graded against the row's task. After
    TrialboxTool ran in the episode (`extra_info` holds its checkpoint), the episode's
    workspace is graded as the tool left it. A sample the platform failed scores 0.0 with
    `loss_mask` 1.0: verl has no way to leave a sample out, so filter on that key (its
    reward_extra_info column) or count it."""
    extra = dict(mapping_of(extra_info, "extra_info"))
    client = Connection.from_env().client()
    future = client.schedule(_grade(client, solution_str, ground_truth, extra))
    try:
        result = await asyncio.wrap_future(future)
    except Exception as exc:
        if not is_infrastructure_failure(exc):
            raise
        log.warning("grading failed on the platform: %s", exc)
        return _score(None)
    return _score(result)


async def _grade(
    client: Client, solution: str, ground_truth: Any, extra_info: dict[str, Any]
) -> ExecutionResult:
    aio = client.aio
    _, ref = await aio.resolve_task(task_cell(ground_truth, extra_info))
    checkpoint = extra_info.get(CHECKPOINT_FIELD)
    if checkpoint:
        await close_session(extra_info.get(SESSION_FIELD))
        try:
            request = ExecutionRequest(
                request_id=request_id("verl", str(extra_info.get(SESSION_FIELD)), checkpoint),
                task_ref=ref,
                base_checkpoint=checkpoint,
            )
        except ValidationError as exc:
            raise InputError(f"extra_info.{CHECKPOINT_FIELD}: {validation_message(exc)}") from None
        (result,) = await aio.run([request])
        return result
    (result,) = await aio.run_group(ref, [completion_text(solution)], extract_code)
    return result


# --- episodes' sessions, for TrialboxTool (trialbox.integrations.verl_tool) -------------------
# verl creates and releases a tool on every call: an episode's session is kept here, keyed on
# `agent_data.request_id` (stable for the episode), on the process's client loop. The grade
# reads the checkpoint the tool wrote into extra_fields, so compute_score may run in another
# process; in this one it also closes the session. Sessions carry a TTL for the rest.

_episodes: dict[str, asyncio.Future[AsyncSession]] = {}


async def episode_session(key: str, task: Task | str, ttl_s: float) -> AsyncSession:
    """The episode's session, opened by its first call (on the client's loop)."""
    opening = _episodes.get(key)
    if opening is None:
        aio = Connection.from_env().client().aio
        opening = _episodes[key] = asyncio.ensure_future(aio.session(task, ttl_s=ttl_s).open())
    try:
        return await asyncio.shield(opening)
    except BaseException:
        if _episodes.get(key) is opening and opening.done():
            del _episodes[key]  # the next call tries again
        raise


async def close_session(session_id: str | None) -> None:
    """Close the episode's session if this process holds it (the TTL ends it otherwise)."""
    for key, opening in list(_episodes.items()):
        if not opening.done() or opening.cancelled() or opening.exception():
            continue
        if opening.result().session_id == session_id:
            del _episodes[key]
            await opening.result().close()


def _score(result: ExecutionResult | None) -> dict[str, Any]:
    if result is None:
        return {"score": 0.0, "loss_mask": 1.0, "status": "infrastructure_failed", "tests": 0.0}
    reward = result.reward_or_none
    return {
        "score": 0.0 if reward is None else reward,
        "loss_mask": float(result.loss_mask),
        "status": result.status.value,
        "tests": float(result.tests_passed),
    }
