"""AsyncClient: stream results, cancel what is no longer needed, and see request ids act as
idempotency keys. On the local twin."""

import asyncio
from pathlib import Path

from trialbox import AsyncClient, ExecutionRequest, RequestIdReused
from trialbox.sdk import request_id

TASKS = Path(__file__).parent / "tasks.jsonl"  # add-two: timeout_s 5
SAMPLES = {
    "right": "def add(a, b):\n    return a + b\n",
    "spins": "def add(a, b):\n    while True:\n        pass\n",  # would time out after 5 s
}


async def main() -> None:
    async with AsyncClient.local() as client:  # starting the twin blocks for a few seconds
        tasks = await client.push_taskset(TASKS)

        def request(name: str, code: str) -> ExecutionRequest:
            return ExecutionRequest(
                request_id=request_id("async-demo", "add-two", name),
                task_ref=tasks.task("add-two"),
                sample_id=name,
                files={"solution.py": code},
            )

        requests = [request(name, code) for name, code in SAMPLES.items()]
        handles = await client.submit(requests)
        async for handle in client.as_completed(handles, timeout=60):
            result = await handle.result()
            print(handle.request.sample_id, result.status.value, result.reward_or_none)
            if result.reward == 1.0:  # enough: end the others now, freeing their sandboxes
                await client.cancel(handles)

        # The same ids with the same content run once: their recorded results come back.
        again = await client.run(requests, timeout=30)
        print("again:", [r.status.value for r in again])

        # The same id with other content is refused, and nothing of that call is submitted.
        try:
            await client.submit([request("right", "def add(a, b):\n    return b + a\n")])
        except RequestIdReused as exc:
            print("refused:", exc.request_id == requests[0].request_id)


asyncio.run(main())
