"""`TrialboxTool`: a verl BaseTool (verl==0.9.1) that runs the model's commands in the
episode's Trialbox session. Importing it imports verl (and so torch and ray).

verl creates and releases a tool on every call; the session is the episode's, keyed on
`agent_data.request_id`. Each call writes the session id and its checkpoint into
`agent_data.extra_fields`, which verl merges into the reward's `extra_info`, so that
`trialbox.integrations.verl.compute_score` grades the workspace the episode left (and closes
the session). The row names its task in `tools_kwargs.<tool name>.create_kwargs.task`, or in
`extra_info.trialbox_task` (a task ref, a task's JSON, or test cases)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from trialbox.errors import InputError, SessionError
from trialbox.integrations.common import (
    BadToolCall,
    Connection,
    adapter_settings,
    is_infrastructure_failure,
    mapping_of,
    task_or_cases,
    tool_argv,
)
from trialbox.integrations.verl import (
    CHECKPOINT_FIELD,
    SESSION_FIELD,
    TASK_FIELD,
    episode_session,
)
from trialbox.models import Task
from trialbox.models.sessions import CallResult

__all__ = ["TrialboxTool"]

PROGRAMS = {"bash": ("command", ["bash", "-c"]), "python": ("code", ["python", "-c"])}


class TrialboxTool(BaseTool):  # type: ignore[misc]
    """`config` (the tool YAML's `config:`, beside `type: native`): `program` ("bash", the
    default, takes a `command`; "python" takes `code`), `ttl_s`, `command_timeout_s`."""

    def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
        self.program = str(config.get("program", "bash"))
        if self.program not in PROGRAMS:
            raise InputError(f"TrialboxTool program must be one of {sorted(PROGRAMS)}")
        super().__init__(config, tool_schema)
        settings = adapter_settings(
            "config", ttl_s=config.get("ttl_s"), command_timeout_s=config.get("command_timeout_s")
        )
        self.ttl_s, self.timeout_s = settings.ttl_s, settings.command_timeout_s
        self._tasks: dict[str, Task | str | None] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        parameter, _ = PROGRAMS[self.program]
        what = "a bash command line" if self.program == "bash" else "Python source code"
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": f"run_{self.program}",
                    "description": f"Run {what} in the task's workspace; returns its output.",
                    "parameters": {
                        "type": "object",
                        "properties": {parameter: {"type": "string", "description": what}},
                        "required": [parameter],
                    },
                },
            }
        )

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        instance_id = instance_id or uuid.uuid4().hex
        cell = mapping_of(kwargs.get("create_kwargs"), "create_kwargs").get("task")
        self._tasks[instance_id] = (
            None if cell is None else task_or_cases(cell, "create_kwargs.task")
        )
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        agent_data = kwargs.get("agent_data")
        if agent_data is None:
            raise InputError("TrialboxTool runs in verl's tool agent loop (it needs agent_data)")
        task = self._tasks.get(instance_id) or _task_of(agent_data)
        parameter, program = PROGRAMS[self.program]
        try:  # the model's arguments: any that cannot run are its error text, never a raise
            if not isinstance(parameters, Mapping):
                raise BadToolCall(
                    f"the `{parameter}` argument is missing: the arguments are not an object"
                )
            argv = tool_argv(program, parameters.get(parameter), f"the `{parameter}` argument")
        except BadToolCall as exc:
            return ToolResponse(text=f"error: {exc}"), 0.0, {}
        client = Connection.from_env().client()
        call = _call(agent_data.request_id, task, self.ttl_s, argv, self.timeout_s)
        try:
            session_id, result = await asyncio.wrap_future(client.schedule(call))
        except Exception as exc:
            if not is_infrastructure_failure(exc):
                raise
            return (
                ToolResponse(text=f"error: the sandbox failed (not your command): {exc}"),
                0.0,
                {},
            )
        if isinstance(result, str):  # this call refused: the model's text
            return ToolResponse(text=result), 0.0, {}
        agent_data.extra_fields[SESSION_FIELD] = session_id
        if result.checkpoint:
            agent_data.extra_fields[CHECKPOINT_FIELD] = result.checkpoint
        return ToolResponse(text=result.feedback), 0.0, {"status": result.status.value}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0  # the episode is graded once, by compute_score

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._tasks.pop(instance_id, None)  # the session is the episode's: it stays open


async def _call(
    key: str, task: Task | str, ttl_s: float, argv: list[str], timeout_s: Any
) -> tuple[str, CallResult | str]:
    """The session's id and the call's result. The session's opening fails as the trainer's
    error or the platform's; this call's own refusal (the session expired or closed) is the
    model's error text."""
    session = await episode_session(key, task, ttl_s)
    try:
        return session.session_id, await session.step(commands=[argv], timeout_s=timeout_s)
    except (InputError, SessionError) as exc:
        return session.session_id, f"error: {exc}"


def _task_of(agent_data: Any) -> Task | str:
    cell = (getattr(agent_data, "extra_fields", None) or {}).get(TASK_FIELD)
    if cell is None:
        raise InputError(
            "TrialboxTool: the row names no task (tools_kwargs.<tool>.create_kwargs.task)"
        )
    return task_or_cases(cell, TASK_FIELD)
