"""Three samples of one task through the whole pipeline on the local twin, each printed as
its result arrives; then the same requests again, which run nothing."""

from pathlib import Path

from trialbox import Client, ExecutionRequest
from trialbox.sdk import request_id

TASKS = Path(__file__).parent / "tasks.jsonl"  # add-two: three hidden tests of add(a, b)
SAMPLES = {
    "right": "def add(a, b):\n    return a + b\n",
    "hard-coded": "def add(a, b):\n    return 3\n",
    "syntax-error": "def add(a, b)\n    return a + b\n",
}

with Client.local() as client:  # or Client.from_stack("Trialbox"), or Client() with TRIALBOX_*
    tasks = client.push_taskset(TASKS)  # a TaskSetRef: tasks@<sha256 of the file>
    requests = [
        ExecutionRequest(
            request_id=request_id("quickstart", "add-two", name),  # the same on every run
            task_ref=tasks.task("add-two"),
            sample_id=name,
            files={"solution.py": code},
        )
        for name, code in SAMPLES.items()
    ]
    handles = client.submit(requests)  # at once; the client sends them as the pool has room
    for handle in client.as_completed(handles, timeout=120):
        result = handle.result()
        reward = "-" if result.reward is None else f"{result.reward:.2f}"
        print(result.sample_id, result.status.value, reward, result.feedback.partition("\n")[0])

    again = client.run(requests, timeout=30)  # same ids, same content: the recorded results
    assert again == [handle.result() for handle in handles]
