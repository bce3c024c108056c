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
    assert harness.lasting_processes() == []
    assert service.failures() == []


def test_checkpoints_keep_hard_links_and_are_bounded_per_session(
    client: Client, service: Service, harness: Harness
) -> None:
    """Issue 22 on rlimit: hard links come back as links after an idle release (one file, not
    thousands), and a session stores at most 4 x disk_mb of checkpoints (16 MiB here): past
    it, a call that changes the workspace is the policy's error and is undone."""
    harness.activate(service)
    limits = {"disk_mb": 4, "memory_mb": 256}
    with client.session(Task.model_validate(ADD_TASK), ttl_s=300, idle_release_s=1,
                        limits=limits) as s:  # fmt: skip
        made = s.exec(["sh", "-c", "echo x > one; for i in $(seq 3000); do ln one l$i; done"])
        assert made.exit_code == 0, made
        time.sleep(2.5)  # released: the next call restores the checkpoint
        after = s.step(commands=[["sh", "-c", "stat -c %h one; ls | wc -l"]])
        assert (after.status, after.error, after.restored_s is not None) == (
            Status.SUCCEEDED,
            None,
            True,
        )
        assert after.commands[0].stdout == "3001\n3002\n"  # solution.py, one, 3,000 links
        refused = None
        for call in range(1, 9):  # 3 MB of fresh random bytes a call: the 6th is past 16 MiB
            noise = s.step(commands=[["sh", "-c", "head -c 3000000 /dev/urandom > noise"]])
            assert (noise.status, noise.loss_mask) == (Status.SUCCEEDED, False), noise
            if noise.error is not None:
                refused = (call, noise.error)
                break
        assert refused is not None and refused[0] == 6, refused
        assert "checkpoint storage" in refused[1] and "the call is undone" in refused[1]
        assert s.exec(["sh", "-c", "stat -c %h one"]).stdout == "3001\n"
    assert service.failures() == []


def test_an_idle_released_session_frees_the_task_for_other_work_then_comes_back(
    client: Client, service: Service, harness: Harness
) -> None:
    """Issue 24: under rlimit an idle release ends the hosting, not only the workspace. The
    pool's one task runs a job and hosts another session meanwhile, each behind the wipe
    check; the first session's next call reopens it on the task from its checkpoint."""
    harness.activate(service)  # the pool's only worker
    task = Task.model_validate(ADD_TASK)
    with client.session(task, ttl_s=300, idle_release_s=1) as first:
        made = first.step(files={"mine.txt": "first\n"}, commands=[python(LEAVE)])
        assert made.status == Status.SUCCEEDED and made.commands[0].exit_code == 0, made
        time.sleep(2.5)  # released: the task takes other work
        check = request(
            commands=[python("import os; print(os.path.exists('/tmp/left-by-session'))")]
        )
        (job,) = client.run([check], timeout=JOB_TIMEOUT_S)
        assert_not_sandbox_error(job)
        assert job.commands[0].stdout == "False\n"  # the session's slot was wiped first
        with client.session(task, ttl_s=300) as second:
            assert second.exec(["test", "-e", "mine.txt"]).exit_code == 1
            assert second.worker == made.worker  # the same task, one session at a time
        back = first.step(commands=[["cat", "mine.txt"]])
        assert back.commands and back.commands[0].stdout == "first\n", back
        assert back.restored_s is not None
        assert (first.epoch, first.failovers, back.worker) == (1, 0, made.worker)
    assert service.failures() == []
