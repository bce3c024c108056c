"""verl's custom reward function: verl loads `compute_score` from this file (see
verl_reward.yaml). Run directly, it scores one sample as verl calls it, on the deployment the
environment names (`trialbox local up`'s exports, or TRIALBOX_STACK)."""

import asyncio
import json

from trialbox.integrations.verl import compute_score

__all__ = ["compute_score"]

if __name__ == "__main__":
    ground_truth = json.dumps({"inputs": ["1 2\n", "5 -3\n"], "outputs": ["3\n", "2\n"]})
    answer = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    print(asyncio.run(compute_score("apps", answer, ground_truth, {"index": 0})))
