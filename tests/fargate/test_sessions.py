"""A session on the worker as Fargate runs it (the rlimit backend). Sessions of one task would
share its /tmp, /proc and IPC, so a task hosts one session at a time and nothing else: a job
sent while the session is held runs only after it closes, and the slot is wiped then, as
after a job. The grade runs from the last checkpoint, here after the close (the pool's only
worker is the session's)."""

from __future__ import annotations

import time

from tests.fargate.harness import Harness, Service
from tests.fargate.submit import JOB_TIMEOUT_S, assert_not_sandbox_error, python, request
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import Status, Task
from trialbox.sandbox.processes import processes_of
from trialbox.sdk import Client

LEAVE = "open('/tmp/left-by-session', 'w').write('x'); open('/dev/shm/left', 'w').write('x')"


def test_a_session_holds_the_task_alone_then_grades_from_its_checkpoint(
    client: Client, service: Service, harness: Harness
) -> None:
    harness.activate(service)  # the pool's only worker
    with client.session(Task.model_validate(ADD_TASK), ttl_s=300) as s:
        first = s.step(files={"solution.py": CORRECT, "notes.txt": "mine\n"},
                       commands=[python(LEAVE)])  # fmt: skip
        assert first.status == Status.SUCCEEDED and first.commands[0].exit_code == 0, first
        assert s.exec(["cat", "notes.txt"]).stdout == "mine\n"
        (waiting,) = client.submit([request(commands=[python("print('job')")])])
        time.sleep(3)
        assert not waiting.done()  # the task is the session's while it is held
        assert s.read_file("solution.py") == CORRECT.encode()
        closed_at = time.time()
    job = waiting.result(timeout=JOB_TIMEOUT_S)
    assert_not_sandbox_error(job)
    assert job.timings.started_at is not None and job.timings.started_at >= closed_at
    check = request(commands=[python("import os; print(os.path.exists('/tmp/left-by-session'))")])
    (after,) = client.run([check], timeout=JOB_TIMEOUT_S)
    assert after.commands[0].stdout == "False\n"  # the session's slot was wiped
    graded = s.grade(timeout=JOB_TIMEOUT_S)
    assert (graded.status, graded.reward) == (Status.SUCCEEDED, 1.0)
    assert processes_of(tuple(harness.slot_uids())) == []
    assert service.failures() == []
