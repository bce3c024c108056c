"""GRPO with TRL, rewarded by Trialbox: `python examples/trl_grpo.py MODEL`, with the
deployment named by the environment (`trialbox local up`'s exports, or TRIALBOX_STACK).
`make integration-smoke` runs it with a tiny random model."""

import sys
from pathlib import Path

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trialbox import Client, Task
from trialbox.integrations.trl import TrialboxReward

TASKS = Path(__file__).parent / "tasks.jsonl"
client = Client()  # TRIALBOX_* from the environment
ref = client.push_taskset(TASKS)
tasks = [Task.model_validate_json(line) for line in TASKS.read_text().splitlines()]
rows = [{"prompt": t.prompt, "task_ref": ref.task(t.task_id)} for t in tasks]

trainer = GRPOTrainer(
    model=sys.argv[1],
    reward_funcs=[TrialboxReward(client)],  # reads each row's task_ref column
    train_dataset=Dataset.from_list(rows),
    args=GRPOConfig(
        output_dir="grpo-out",
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
    ),  # fmt: skip
)
trainer.train()
print("step 1 reward mean:", trainer.state.log_history[0]["reward"])
