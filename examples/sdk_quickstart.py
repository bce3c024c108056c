"""Two policy samples for one task, through the whole pipeline on the local twin."""

from trialbox.client import Client
from trialbox.models import ExecutionRequest

task = {
    "task_id": "add-two",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": "from solution import add\n"
        "def test_small():\n    assert add(1, 2) == 3\n"
        "def test_negative():\n    assert add(-1, -2) == -3\n"
    },
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
}
samples = {
    "right": "def add(a, b):\n    return a + b\n",
    "hard-coded": "def add(a, b):\n    return 3\n",
}

with Client.local() as client:  # or Client.from_stack("Trialbox"), or Client() with TRIALBOX_* env
    requests = [
        ExecutionRequest(request_id=name, task=task, files={"solution.py": code})
        for name, code in samples.items()
    ]
    for result in client.run(requests, timeout=300):
        print(result.request_id, result.status.value, result.reward)
