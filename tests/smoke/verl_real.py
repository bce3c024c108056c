"""`make integration-smoke`, verl's part: verl 0.9.1 itself (torch on the CPU, ray, no GPU)
drives the adapters against `trialbox local up` (tests/smoke/with_twin.py), through its own
code wherever it runs without a GPU cluster:

- the tool config `examples/verl_tool.yaml`, loaded by verl's `initialize_tools_from_config`
  (so TrialboxTool is a real BaseTool, with verl's schemas);
- an episode of three calls through verl's own `ToolAgentLoop._call_tool` (create, execute,
  release per call, with a real AgentData), then the reward;
- the reward function `examples/verl_reward.yaml` names, loaded by verl's
  `get_custom_reward_fn` and awaited with the naive manager's keyword arguments;
- verl's own SandboxFusion client (`check_correctness`) against the twin's /run_code.

Exits non-zero if anything differs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import types
from pathlib import Path

from omegaconf import OmegaConf
from report import report  # this directory (the scripts run by their paths)
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.base_tool import BaseTool
from verl.tools.tool_registry import initialize_tools_from_config
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

from trialbox.integrations import verl as trialbox_verl
from trialbox.models import Task
from trialbox.sdk import Client

ROOT = Path(__file__).resolve().parents[2]
TASK = {
    "task_id": "add-two",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": "from solution import add\n"
        "def test_small():\n    assert add(1, 2) == 3\n"
        "def test_negative():\n    assert add(-1, -2) == -3\n"
    },
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
FIXED = "printf 'def add(a, b):\\n    return a + b\\n' > solution.py"


async def episode(ref: str, problems: list[str]) -> None:
    (tool,) = initialize_tools_from_config(str(ROOT / "examples" / "verl_tool.yaml"))
    if not isinstance(tool, BaseTool):
        problems.append(f"the YAML's tool is a {type(tool).__name__}")
    # ToolAgentLoop._call_tool needs only these of the loop's state.
    loop = types.SimpleNamespace(
        tools={tool.name: tool}, max_tool_response_length=256, tool_response_truncate_side="middle"
    )
    agent = AgentData(
        messages=[], image_data=[], video_data=[], audio_data=None, mm_processor_kwargs=None,
        metrics={}, request_id="smoke-episode", tools_kwargs={},
    )  # fmt: skip
    tools_kwargs = {tool.name: {"create_kwargs": {"task": ref}}}
    texts = []
    for command in (
        "cat solution.py",
        FIXED,
        "python -c 'import solution; print(solution.add(2, 2))'",
    ):
        call = FunctionCall(name=tool.name, arguments=json.dumps({"command": command}))
        response, _, _ = await ToolAgentLoop._call_tool(loop, call, tools_kwargs, agent)
        texts.append(response.text)
        print(f"tool call {command[:40]!r}: {response.text!r:.120}")
    if "NotImplementedError" not in texts[0] or "4" not in texts[2]:
        problems.append(f"tool answers: {texts}")
    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": str(ROOT / "examples" / "verl_reward.py"),
                                               "name": "compute_score"}}}
    )  # fmt: skip
    compute_score = get_custom_reward_fn(config)
    extra_info = {"index": 0, **agent.extra_fields}  # naive.py merges the tool's extra fields
    scored = await compute_score(
        data_source="smoke", solution_str="done", ground_truth=ref, extra_info=extra_info
    )
    print(f"episode reward: {scored}")
    if scored != {"score": 1.0, "loss_mask": 0.0, "status": "succeeded", "tests": 2.0}:
        problems.append(f"episode reward {scored}")
    cases = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    answer = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    direct = await compute_score(
        data_source="apps", solution_str=answer, ground_truth=cases, extra_info={}
    )
    print(f"test-case reward: {direct}")
    if direct["score"] != 1.0:
        problems.append(f"test-case reward {direct}")


def main() -> int:
    """Run under tests/smoke/with_twin.py: the twin's exports are in the environment."""
    problems: list[str] = []
    with Client() as client:  # the TRIALBOX_* environment, as a verl worker has it
        ref = client.push_tasks([Task.model_validate(TASK)], name="verl-smoke").task("add-two")
    asyncio.run(episode(ref, problems))
    url = os.environ["SANDBOX_FUSION_ENDPOINT"] + "/run_code"  # verl posts to it as given
    in_outs = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    code = "a, b = map(int, input().split())\nprint(a + b)\n"
    verdicts, _ = check_correctness(url, in_outs, code, timeout=10)
    wrong, _ = check_correctness(url, in_outs, code.replace("+", "-"), timeout=10)
    print(f"verl check_correctness via /run_code: right {verdicts}, wrong {wrong}")
    if verdicts != [True, True] or wrong != [False, False]:
        problems.append(f"check_correctness: {verdicts} {wrong}")
    if trialbox_verl._episodes:
        problems.append("an episode's session was left open")
    return report("verl smoke", problems)


if __name__ == "__main__":
    sys.exit(main())
