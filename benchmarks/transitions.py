"""Billed Step Functions transitions per sample, counted from the executions' histories
(trialbox.metering), for samples sent together (a batch: one dispatcher invocation admits
them all) against the baseline of the same samples sent one at a time (a Rollout each, 4).
A twin of `--workers` workers, so that each round's samples all find a slot.
Run: `.venv/bin/python benchmarks/transitions.py --rounds 3 --size 8`.
"""

from __future__ import annotations

import argparse

from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.metering import machine_transitions
from trialbox.models import ExecutionRequest
from trialbox.sdk import Client

TEST = "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
TASK = {
    "task_id": "add",
    "hidden_tests": {"tests/test_add.py": TEST},
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}


def sample(request_id: str) -> ExecutionRequest:
    body = {
        "request_id": request_id,
        "task": TASK,
        "files": {"solution.py": "def add(a, b):\n    return a + b\n"},
    }
    return ExecutionRequest.model_validate(body)


def billed(twin: LocalTwin) -> dict[str, int]:
    sfn = twin.client("stepfunctions")
    counts: dict[str, int] = {}
    for name, output in (("batch", c.OUTPUT_BATCH_ARN), ("rollout", c.OUTPUT_ROLLOUT_ARN)):
        executions, transitions = machine_transitions(sfn, twin.output(output))
        counts[f"{name}_executions"] = executions
        counts[f"{name}_transitions"] = transitions
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=8, help="samples sent together a round")
    args = parser.parse_args()
    with Client.local(workers=args.size) as client:
        twin = client.aio._twin
        assert twin is not None
        twin.leased(args.size)
        for n in range(args.size):  # the baseline: one at a time
            client.run([sample(f"alone-{n}")], timeout=120)
        alone = billed(twin)
        for r in range(args.rounds):
            client.run([sample(f"together-{r}-{n}") for n in range(args.size)], timeout=300)
        after = billed(twin)
    together = args.rounds * args.size
    per_alone = alone["rollout_transitions"] / args.size
    spent = sum(after[k] - alone[k] for k in ("batch_transitions", "rollout_transitions"))
    print(f"alone      {args.size} samples, {per_alone:.3f} billed transitions a sample")
    print(
        f"together   {together} samples in {after['batch_executions']} batch(es), "
        f"{spent / together:.3f} a sample ({per_alone * together / max(spent, 1):.1f}x fewer)"
    )


if __name__ == "__main__":
    main()
