"""An episode as verl's tool agent loop runs it: TrialboxTool from verl_tool.yaml, created and
released on every call, one session for the episode (its request_id); then compute_score
grades the workspace the calls left."""

import asyncio
import sys
import types
from pathlib import Path

import yaml

from trialbox.integrations.verl import compute_score

CONFIG = yaml.safe_load((Path(__file__).parent / "verl_tool.yaml").read_text())
TASK = sys.argv[1]  # a task ref


async def episode() -> dict:
    from trialbox.integrations.verl_tool import TrialboxTool  # imports verl

    spec = CONFIG["tools"][0]
    agent_data = types.SimpleNamespace(request_id="episode-0", extra_fields={})
    commands = ["cat solution.py", "printf 'def add(a, b):\\n    return a + b\\n' > solution.py"]
    for command in commands:  # as tool_agent_loop._call_tool does, per call
        tool = TrialboxTool(config=spec["config"], tool_schema=None)
        instance_id, _ = await tool.create(create_kwargs={"task": TASK})
        response, _, _ = await tool.execute(
            instance_id, {"command": command}, agent_data=agent_data
        )
        await tool.release(instance_id)
        print(f"$ {command}\n{response.text}")
    return await compute_score("trialbox", "done", TASK, dict(agent_data.extra_fields))


print(asyncio.run(episode()))
