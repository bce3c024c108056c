"""`make integration-smoke`: TRL's real GRPOTrainer (trl==1.16.0, torch on the CPU) trains a
tiny random causal LM for 2 steps with `reward_funcs=[TrialboxReward(...)]` on the local twin.

Nothing is downloaded from a hub: the model is random and the tokenizer is byte-level with
no merges (any text round-trips). A random model writes no code, so a `rollout_func` scripts
the completions. Step 1's group: right (1.0), half right (0.5), wrong (0.0) and no code (0.0).
Step 2's group is graded while the deployment is unreachable (an injected infrastructure
failure): every reward is None, never 0. Exits non-zero if anything differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from report import report  # this directory (the scripts run by their paths)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from trialbox.integrations.common import Connection
from trialbox.integrations.trl import TrialboxReward
from trialbox.models import Task
from trialbox.sdk import Client

ROOT = Path(__file__).resolve().parents[2]
TASK = {
    "task_id": "add-two",
    "prompt": "Write add(a, b) in solution.py",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": "from solution import add\n"
        "def test_small():\n    assert add(1, 2) == 3\n"
        "def test_negative():\n    assert add(-1, -2) == -3\n"
    },
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
GROUP = [
    "```python\ndef add(a, b):\n    return a + b\n```",  # right: 1.0
    "```python\ndef add(a, b):\n    return 3 if a > 0 else a - b\n```",  # half: 0.5
    "```python\ndef add(a, b):\n    return a - b\n```",  # wrong: 0.0
    "I would rather not write code.",  # no code: 0.0
]
EXPECTED = {1: [1.0, 0.5, 0.0, 0.0], 2: [None, None, None, None]}


def tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    vocab["<eos>"] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", pad_token="<eos>")


class RecordedReward(TrialboxReward):
    """TrialboxReward as it is, with what it returned kept per step; from step 2 on, its
    deployment is unreachable (the injected failure)."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.unreachable = Connection(
            resources=client.aio.resources, endpoint_url="http://127.0.0.1:9", region="us-east-1"
        )
        self.returned: dict[int, list[float | None]] = {}
        self.seconds: dict[int, float] = {}

    def __call__(self, *args: Any, trainer_state: Any = None, **kwargs: Any) -> Any:
        step = trainer_state.global_step + 1
        if step == 2:
            self.connection = self.unreachable
        started = time.perf_counter()
        rewards = super().__call__(*args, trainer_state=trainer_state, **kwargs)
        self.seconds[step] = time.perf_counter() - started
        self.returned[step] = rewards
        return rewards


def run_example(model_dir: str, client: Client) -> str:
    twin = client.aio._twin
    assert twin is not None
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "trl_grpo.py"), model_dir],
        env=os.environ | twin.sdk_env(), capture_output=True, text=True, timeout=600,
        cwd=model_dir,
    )  # fmt: skip
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.stdout


def main() -> int:
    torch.manual_seed(0)
    tok = tokenizer()
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )
    )  # fmt: skip

    def rollout(prompts: list[str], trainer: Any) -> dict[str, Any]:
        """The scripted completions, one per prompt (TRL repeats each prompt per generation)."""
        completions = [GROUP[i % len(GROUP)] for i in range(len(prompts))]
        return {
            "prompt_ids": [tok(p)["input_ids"] for p in prompts],
            "completion_ids": [tok(c)["input_ids"] + [tok.eos_token_id] for c in completions],
            "logprobs": None,
        }

    with Client.local(workers=2) as client:
        ref = client.push_tasks([Task.model_validate(TASK)], name="smoke").task("add-two")
        reward = RecordedReward(client)
        dataset = Dataset.from_list([{"prompt": TASK["prompt"], "task_ref": ref}] * 8)
        with tempfile.TemporaryDirectory() as out:
            config = GRPOConfig(
                output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4,
                num_generations=4, max_completion_length=256, max_steps=2, logging_steps=1,
                report_to="none", gradient_checkpointing=False, save_strategy="no",
            )  # fmt: skip
            trainer = GRPOTrainer(
                model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                processing_class=tok, rollout_func=rollout,
            )  # fmt: skip
            trainer.train()
            logs = [entry for entry in trainer.state.log_history if "trialbox/masked" in entry]
            # examples/trl_grpo.py as a user runs it: the model by path, the twin by env.
            model.save_pretrained(f"{out}/model")
            tok.save_pretrained(f"{out}/model")
            example = run_example(f"{out}/model", client)
    for step, rewards in sorted(reward.returned.items()):
        print(f"step {step}: rewards {rewards} ({reward.seconds[step]:.2f} s for the group)")
    for step, entry in enumerate(logs, 1):
        shown = {k: v for k, v in entry.items() if k.startswith(("trialbox/", "reward"))}
        print(f"step {step} logged: {json.dumps(shown, sort_keys=True)}")
    print(f"examples/trl_grpo.py printed: {example!r}")
    problems = []
    if "step 1 reward mean: 0.0" not in example:  # a random model writes no code
        problems.append("examples/trl_grpo.py did not train")
    if reward.returned != EXPECTED:
        problems.append(f"rewards {reward.returned} != {EXPECTED}")
    if len(logs) != 2 or logs[0]["trialbox/succeeded"] != 1.0 or logs[1]["trialbox/masked"] != 1.0:
        problems.append(f"logged metrics: {logs}")
    return report("integration smoke", problems)


if __name__ == "__main__":
    sys.exit(main())
