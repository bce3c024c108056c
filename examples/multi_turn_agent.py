"""A multi-turn agent episode on the local twin: a scripted "model" writes code, runs the
visible check, reads the feedback and fixes its code, over 3 turns; then GRPO's "prepare
once, fork N": forks of the fixed workspace try variants, and each is graded on the hidden
tests."""

from pathlib import Path

from trialbox import Client, Task

TASKS = Path(__file__).parent / "tasks.jsonl"
task = Task.model_validate_json(TASKS.read_text().splitlines()[0])  # add-two: solution.py
CHECK = ["python", "-c", "from solution import add; assert add(2, 3) == 5, add(2, 3); print('ok')"]


def model(feedback: str) -> str:
    """The scripted model: its next answer, from what the last turn's feedback said."""
    if not feedback:
        return "def add(a, b):\n    return a - b\n"  # a first try: wrong
    if "AssertionError" in feedback:
        return "def add(a, b)\n    return a + b\n"  # the fix, with a slip: no colon
    return "def add(a, b):\n    return a + b\n"  # the SyntaxError read and fixed


with Client.local() as client, client.session(task, ttl_s=600) as session:
    feedback = ""
    for turn in range(3):
        result = session.step(files={"solution.py": model(feedback)}, commands=[CHECK])
        feedback = result.feedback
        last = feedback.splitlines()[-1]
        print(f"turn {turn + 1}: exit {result.commands[0].exit_code}: {last}")
    forks = session.fork(2)
    forks[1].write_files({"solution.py": "def add(a, b):\n    return 5\n"})  # a worse variant
    for name, each in [("episode", session), ("fork 1", forks[0]), ("fork 2", forks[1])]:
        graded = each.grade(timeout=120)
        print(name, graded.status.value, f"reward {graded.reward:.2f}")
    for fork in forks:
        fork.close()
