"""What each trainer adapter adds on the local twin: a reward (a GRPO group of 4) through
TrialboxReward and verl's compute_score against `run_group`; a tool call through TRL's
environment, verl's tool and SkyRL's env against `session.step`; a SandboxFusion call over
the twin's function URL (the RunCode handler) against the same execution request through the
SDK. Interleaved, median of n each.

    .venv/bin/python benchmarks/integrations_overhead.py -n 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import verl_signatures
from tests.support.tasks import ADD_TASK
from trialbox import constants as c
from trialbox.integrations import sandbox_fusion as sf
from trialbox.integrations import verl
from trialbox.integrations.trl import TrialboxReward, environment_factory
from trialbox.models import Task
from trialbox.sdk import Client


def code(rep: int, body: str) -> str:
    return f"```python\n# {rep}\ndef add(a, b):\n    return {body}\n```"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=10)
    n = parser.parse_args().n
    sys.modules |= verl_signatures.modules()  # verl imports torch and ray
    from trialbox.integrations.verl_tool import TrialboxTool

    with Client.local(workers=2) as client:
        os.environ.update(client.aio._twin.sdk_env())  # type: ignore[union-attr]
        ref = client.push_tasks([Task.model_validate(ADD_TASK)], name="bench").task("add-two")
        reward = TrialboxReward(client)
        url = client.aio._twin.outputs[c.OUTPUT_RUN_CODE_URL] + "run_code"  # type: ignore[union-attr]
        times: dict[str, list[float]] = {}

        def group(rep: int) -> list[str]:
            return [code(rep, b) for b in ("a + b", "a - b", "3", "b + a")]

        def add(name: str, seconds: float) -> None:
            times.setdefault(name, []).append(seconds)

        # /run_code first, while no session holds one of the pool's slots.
        payload = {"code": "print(1)", "language": "python"}
        call = sf.RunCodeRequest.model_validate(payload)
        for _ in range(n):
            add("run_code: SDK request", timed(lambda: client.run([sf.execution_request(call)])))
            add(
                "run_code: function URL /run_code",
                timed(lambda: requests.post(url, json=payload, timeout=60)),
            )
        session = client.session(ref)
        env = environment_factory(client)()
        env.reset(task_ref=ref)
        tool = TrialboxTool(config={"type": "native"}, tool_schema=None)
        agent = types.SimpleNamespace(request_id="bench", extra_fields={})
        import skyrl_gym

        import trialbox.integrations.skyrl  # noqa: F401

        sky = skyrl_gym.make("trialbox", env_config={"max_turns": 10**6}, extras={"task_ref": ref})
        sky.init([])

        async def verl_tool_call(rep: int) -> None:
            instance, _ = await tool.create(create_kwargs={"task": ref})
            await tool.execute(instance, {"command": f"echo {rep}"}, agent_data=agent)
            await tool.release(instance)

        for rep in range(n):
            base = 10 * rep
            add(
                "reward: run_group (SDK)",
                timed(lambda base=base: client.run_group(ref, group(base))),
            )
            add(
                "reward: TrialboxReward",
                timed(
                    lambda base=base: reward(
                        prompts=["p"] * 4, completions=group(base + 1), task_ref=[ref] * 4
                    )
                ),
            )
            add(
                "reward: verl compute_score (1 sample)",
                timed(
                    lambda base=base: asyncio.run(
                        verl.compute_score("x", code(base + 2, "a + b"), ref, {})
                    )
                ),
            )
            add("tool: session.step (SDK)", timed(lambda: session.step(commands=[["echo", "1"]])))
            add("tool: TRL environment bash", timed(lambda: env.bash(command="echo 1")))
            add("tool: verl TrialboxTool", timed(lambda rep=rep: asyncio.run(verl_tool_call(rep))))
            add("tool: SkyRL step (bash)", timed(lambda: sky.step("```bash\necho 1\n```")))
        session.close()
        sky.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    baselines = {"reward": "reward: run_group (SDK)", "tool": "tool: session.step (SDK)"}
    baselines["run_code"] = "run_code: SDK request"
    print(f"{'path':40} {'median s':>9} {'x baseline':>11}")
    for name, median in medians.items():
        ratio = median / medians[baselines[name.split(":")[0]]]
        print(f"{name:40} {median:9.3f} {ratio:11.2f}")
    print(json.dumps({k: round(v, 4) for k, v in medians.items()}))


if __name__ == "__main__":
    main()
