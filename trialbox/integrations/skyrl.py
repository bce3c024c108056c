"""SkyRL (skyrl-gym==0.4.0): `TrialboxTextEnv`, a `BaseTextEnv` backed by a Trialbox session,
registered as "trialbox".

A row names its task in `extras["task_ref"]`, or in `extras["reward_spec"]["ground_truth"]`
(a task ref, a task's JSON, or test cases, graded as an inline `io_match` task). Each turn,
the model's last fenced block decides: a `bash` (or `sh`) block runs in the workspace and its
output is the next observation; otherwise the episode ends and is graded, with the last
Python block (or unlabelled block defining a starter name) written to the task's starter file
first, if there is one. At `max_turns` the workspace is graded as it is.

SkyRL has no per-sample mask: a sample the platform failed (`loss_mask`) gets reward 0.0, with
`metadata["loss_mask"]` true and its status, so that a trainer can drop it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register

from trialbox.errors import InputError, SessionError
from trialbox.integrations.common import (
    BadToolCall,
    Connection,
    adapter_settings,
    is_infrastructure_failure,
    mapping_of,
    task_of,
    task_or_cases,
    tool_argv,
)
from trialbox.models import ExecutionResult, Task, ungradable
from trialbox.sdk.extract import PYTHON_INFO, defined_names, fenced_blocks, files_for

__all__ = ["ENV_ID", "TrialboxTextEnv"]

ENV_ID = "trialbox"
SHELL_INFO = frozenset({"bash", "sh", "shell"})


class TrialboxTextEnv(BaseTextEnv):  # type: ignore[misc]
    """`env_config` (SkyRL's `environment.skyrl_gym.trialbox`): `stack` and `region` (else the
    TRIALBOX_* environment), `max_turns`, `ttl_s`."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Any = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        extras = dict(mapping_of(extras, "extras"))
        stack = config.get("stack")
        self.connection = (
            Connection(stack=stack, region=config.get("region")) if stack else Connection.from_env()
        )
        settings = adapter_settings(
            "env_config", max_turns=config.get("max_turns"), ttl_s=config.get("ttl_s")
        )
        self.max_turns, self.ttl_s = settings.max_turns, settings.ttl_s
        self.task = _task(extras)
        self.session: Any = None

    def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
        self.session = self.connection.client().session(self.task, ttl_s=self.ttl_s)
        return prompt, {"session_id": self.session.session_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.session is None:
            raise InputError("no episode: init() starts one (this one may have ended)")
        self.turns += 1
        blocks = fenced_blocks(action)
        if blocks and blocks[-1][0] in SHELL_INFO and self.turns < self.max_turns:
            info, script = blocks[-1]
            try:  # what the model wrote: a block that cannot run is its error text
                argv = tool_argv(["bash", "-c"], script, f"the `{info}` block")
            except BadToolCall as exc:
                text = f"error: {exc}"
            else:
                text = self._run(argv)
            return BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": text}],
                reward=0.0,
                done=False,
                metadata={},
            )
        try:
            result = self._grade(blocks)
        finally:
            self.close()  # the episode is over, whatever its grade did
        return BaseTextEnvStepOutput(
            observations=[], reward=_reward(result), done=True, metadata=_metadata(result)
        )

    def _run(self, argv: list[str]) -> str:
        """The block's feedback; this call's own refusal (the session expired) is the
        model's error text, and so is a platform failure (as the TRL and verl tools say it)."""
        try:
            feedback: str = self.session.step(commands=[argv]).feedback
        except (InputError, SessionError) as exc:
            return f"error: {exc}"
        except Exception as exc:
            if not is_infrastructure_failure(exc):
                raise
            return f"error: the sandbox failed (not your command): {exc}"
        return feedback

    def _grade(self, blocks: list[tuple[str, str]]) -> ExecutionResult:
        """The workspace graded with the answer written to it; an answer that cannot be
        written (text that is not valid Unicode, say) is the model's 0, without a run."""
        files = files_for(self.workspace(), self._answer(blocks))
        if files:
            try:
                self.session.write_files(files)
            except InputError as exc:
                return ungradable(None, self.session.aio.task.task_id, "0", str(exc))
        result: ExecutionResult = self.session.grade()
        return result

    def _answer(self, blocks: list[tuple[str, str]]) -> str | None:
        """The last block that is Python (by its info string), or unlabelled and defining a
        name the starter file defines: an output or a note in a block replaces nothing."""
        defines = set().union(*(defined_names(str(c)) for c in self.workspace().values()))
        answers = [
            code for info, code in blocks
            if info in PYTHON_INFO or (info == "" and not defined_names(code).isdisjoint(defines))
        ]  # fmt: skip
        return answers[-1] if answers else None

    def workspace(self) -> dict[str, Any]:
        """The task's starter files, where an answer's code goes."""
        return dict(self.session.aio.task.workspace)

    def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.close()


def _task(extras: dict[str, Any]) -> Task | str:
    cell = extras.get("task_ref")
    if cell is not None:
        return task_of(cell, "task_ref")
    truth = mapping_of(extras.get("reward_spec"), "extras.reward_spec").get("ground_truth")
    if truth is None:
        raise InputError(
            'the row names no task: give extras "task_ref" or reward_spec.ground_truth'
        )
    return task_or_cases(truth, "reward_spec.ground_truth")


def _reward(result: ExecutionResult) -> float:
    reward = result.reward_or_none
    return 0.0 if reward is None else reward


def _metadata(result: ExecutionResult) -> dict[str, Any]:
    return {
        "status": result.status.value,
        "loss_mask": result.loss_mask,
        "tests_passed": result.tests_passed,
        "tests_expected": result.tests_expected,
        "feedback": result.feedback,
    }


register(id=ENV_ID, entry_point=f"{__name__}:TrialboxTextEnv")
