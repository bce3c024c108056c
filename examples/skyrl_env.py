"""A SkyRL episode in the "trialbox" environment: look with bash, then answer; on the
deployment the environment names (`trialbox local up`'s exports, or env_config's `stack`)."""

import sys

import skyrl_gym

import trialbox.integrations.skyrl  # noqa: F401 (registers "trialbox")

env = skyrl_gym.make("trialbox", env_config={"max_turns": 4}, extras={"task_ref": sys.argv[1]})
env.init([{"role": "user", "content": "Write add(a, b) in solution.py"}])
looked = env.step("First, the starter file:\n```bash\ncat solution.py\n```")
print(looked["observations"][0]["content"])
answered = env.step("```python\ndef add(a, b):\n    return a + b\n```")
print("reward:", answered["reward"], "done:", answered["done"])
env.close()
