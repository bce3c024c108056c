"""`make integration-smoke`: TRL's real GRPOTrainer (trl==1.16.0, torch on the CPU) runs
`environment_factory=environment_factory(client)` for a step on the local twin: TRL probes
the environment for its tools, resets one per rollout from its row, parses each completion's
tool call, runs it as the environment's `bash` tool, and asks `get_reward()` for the reward.

Nothing is downloaded: a tiny random model, a byte-level tokenizer with Qwen3's chat template
(TRL's copy, which TRL knows how to parse tool calls from) and its special tokens. A random
model calls no tool, so a `rollout_func` scripts each rollout's first turn: a `bash` call that
writes a right, half right or wrong solution.py, or no call at all. The random model writes
the turn after the tool's answer. Exits non-zero if anything differs.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from typing import Any

import torch
from datasets import Dataset
from report import report  # this directory (the scripts run by their paths)
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template
from trl_grpo import TASK, tokenizer

from trialbox.integrations.trl import TrialboxEnvironment, environment_factory
from trialbox.models import Task
from trialbox.sdk import Client

# Qwen3's added tokens: the turn markers are special, the tool-call tags are not (decoding
# keeps them, and TRL's parser finds the calls between them).
TURNS = ["<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
ANSWERS = [
    "def add(a, b):\n    return a + b\n",  # right: 1.0
    "def add(a, b):\n    return 3 if a > 0 else a - b\n",  # half: 0.5
    "def add(a, b):\n    return a - b\n",  # wrong: 0.0
    None,  # no tool call: the starter raises, 0.0
]
EXPECTED = [1.0, 0.5, 0.0, 0.0]


def first_turn(answer: str | None) -> str:
    if answer is None:
        return "I will not touch the files.<|im_end|>"
    command = f"cat > solution.py <<'EOF'\n{answer}EOF"
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


def main() -> int:
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": TURNS})
    tok.add_tokens(TAGS)
    tok.chat_template = qwen3_chat_template
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        )
    )  # fmt: skip
    episodes: list[TrialboxEnvironment] = []
    tool_answers: list[str] = []
    rewards: list[float | None] = []

    with Client.local(workers=2) as client:
        ref = client.push_tasks([Task.model_validate(TASK)], name="smoke").task("add-two")
        made = environment_factory(client)

        def factory() -> TrialboxEnvironment:
            """The factory as it is; each instance's tool answers and rewards kept."""
            env = made()
            bash, get_reward = env.bash, env.get_reward

            @functools.wraps(bash)  # TRL names a tool by its __name__
            def recorded_bash(command: str) -> str:
                answer = bash(command)
                tool_answers.append(answer)
                return answer

            def recorded_reward() -> float | None:
                reward = get_reward()
                rewards.append(reward)
                return reward

            env.bash = recorded_bash  # type: ignore[method-assign]
            env.get_reward = recorded_reward  # type: ignore[method-assign]
            episodes.append(env)
            return env

        def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            """Each rollout's first turn, scripted; TRL runs the tool calls and the rest."""
            prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
            turns = [first_turn(ANSWERS[i % len(ANSWERS)]) for i in range(len(prompts))]
            return {
                "prompt_ids": prompt_ids,
                "completion_ids": [tok(t, add_special_tokens=False)["input_ids"] for t in turns],
                "logprobs": None,
            }

        prompt = [{"role": "user", "content": TASK["prompt"]}]
        dataset = Dataset.from_list([{"prompt": prompt, "task_ref": ref}] * 4)
        with tempfile.TemporaryDirectory() as out:
            config = GRPOConfig(
                output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4,
                num_generations=4, max_completion_length=1024, max_steps=1, logging_steps=1,
                report_to="none", gradient_checkpointing=False, save_strategy="no",
                max_tool_calling_iterations=1,
            )  # fmt: skip
            trainer = GRPOTrainer(
                model=model, reward_funcs=[], args=config, train_dataset=dataset,
                processing_class=tok, rollout_func=rollout, environment_factory=factory,
            )  # fmt: skip
            trainer.train()
            logged = [e for e in trainer.state.log_history if "reward" in e]
        for env in episodes:
            env._end()  # TRL has no close hook: the sessions' TTLs would end them
    print(f"tool answers: {tool_answers}")
    print(f"rewards: {rewards}")
    shown = {k: v for k, v in (logged or [{}])[0].items() if k.startswith(("reward", "tools/"))}
    print(f"logged: {json.dumps(shown, sort_keys=True)}")
    problems = []
    if sorted(r for r in rewards if r is not None) != sorted(EXPECTED) or len(rewards) != 4:
        problems.append(f"rewards {rewards}, expected {EXPECTED} in some order")
    if len(tool_answers) != 3 or not all("(exit 0," in a for a in tool_answers):
        problems.append(f"tool answers: {tool_answers}")
    if not logged or abs(logged[0]["reward"] - sum(EXPECTED) / 4) > 1e-6:
        problems.append(f"logged: {logged}")
    return report("environment smoke", problems)


if __name__ == "__main__":
    sys.exit(main())
