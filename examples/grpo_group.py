"""GRPO: a group of completions for one task, graded together on the local twin; then
group-relative advantages from the rewards a trainer may learn from."""

import statistics
from pathlib import Path

from trialbox import Client, Task

TASKS = Path(__file__).parent / "tasks.jsonl"
task = Task.model_validate_json(TASKS.read_text().splitlines()[0])  # add-two: solution.py


def fenced(code: str, info: str = "python") -> str:
    return f"```{info}\n{code}```\n"


completions = [
    "Here is add:\n\n" + fenced("def add(a, b):\n    return a + b\n"),
    "<think>\n"  # a draft in the reasoning, then the final answer: the last block wins
    + fenced("def add(a, b):\n    return a - b\n")
    + "No: that subtracts.\n</think>\n"
    + fenced("def add(a, b):\n    return b + a\n", info="py"),
    "The example says 3:\n" + fenced("def add(a, b):\n    return 3\n", info=""),
    "I would add the two numbers with the + operator.",  # no code: 0.0, no sandbox
]

with Client.local() as client:
    results = client.run_group(task, completions, timeout=120)  # in the completions' order

rewards = [r.reward_or_none for r in results]  # None: leave the sample out of the group
kept = [r for r in rewards if r is not None]
mean, std = statistics.fmean(kept), statistics.pstdev(kept) or 1.0
for result, reward in zip(results, rewards, strict=True):
    if reward is None:  # rejected, sandbox_error or cancelled
        print(result.sample_id, result.status.value, "left out")
        continue
    advantage = (reward - mean) / std
    print(result.sample_id, f"reward {reward:.2f}", f"advantage {advantage:+.2f}", *result.flags)
