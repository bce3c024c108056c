"""Sessions on the local twin: one workspace over many tool calls, on worker processes, with
failover, idle release, TTLs, re-sent calls and a grade that runs once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import LOST_WORKER_HEARTBEAT_S, twin_and_client, twin_of
from trialbox import constants as c
from trialbox.local.poller import SCHEDULE_CAP_S
from trialbox.local.twin import LocalTwin
from trialbox.models import Status, Task
from trialbox.models.sessions import Call, Reply
from trialbox.pipeline.reaper import GRACE_S
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.processes import processes_of
from trialbox.sandbox.slots import SlotPool
from trialbox.sdk import Client
from trialbox.sdk.sessions import RECEIVE_WAIT_S, REPLY_TAG_STEP_S

TASK = Task.model_validate(ADD_TASK)
WRONG = "def add(a, b):\n    return 3\n"


def test_the_workspace_carries_over_from_call_to_call(client: Client) -> None:
    with client.session(TASK) as s:
        first = s.step(files={"notes.txt": "a\n"}, commands=[["sh", "-c", "echo b >> notes.txt"]])
        assert first.status == Status.SUCCEEDED and first.commands[0].exit_code == 0
        assert "$ sh -c 'echo b >> notes.txt'  (exit 0" in first.feedback
        out = s.exec(["cat", "notes.txt", "solution.py"])
        assert out.stdout.startswith("a\nb\ndef add(a, b):\n    raise NotImplementedError")
        assert s.read_file("notes.txt") == b"a\nb\n"
        missing = s.step(commands=[["python", "-c", "import nothing_here"]])
        assert missing.commands[0].exit_code == 1 and "ModuleNotFoundError" in missing.feedback


def test_forks_start_from_the_same_state_and_go_their_own_ways(client: Client) -> None:
    with client.session(TASK) as s:
        s.write_files({"solution.py": CORRECT, "shared.txt": "before\n"})
        forks = s.fork(3)
        try:
            forks[0].write_files({"solution.py": WRONG})
            forks[1].exec(["rm", "shared.txt"])
            assert [f.read_file("solution.py") for f in forks] == [
                WRONG.encode(),
                CORRECT.encode(),
                CORRECT.encode(),
            ]
            assert s.read_file("shared.txt") == forks[0].read_file("shared.txt") == b"before\n"
            assert forks[1].exec(["test", "-e", "shared.txt"]).exit_code == 1
            rewards = [f.grade(timeout=120).reward for f in forks]
            assert rewards == [0.5, 1.0, 1.0] and s.grade(timeout=120).reward == 1.0
        finally:
            for fork in forks:
                fork.close()


def test_oom_and_timeout_end_the_call_only(client: Client) -> None:
    with client.session(TASK, limits={"memory_mb": 128, "timeout_s": 5}) as s:
        s.write_files({"keep.txt": "kept\n"})
        hog = s.step(commands=[["python", "-c", "b = bytearray(512 << 20); print(len(b))"]])
        assert (hog.status, hog.loss_mask, hog.commands[0].oom_killed) == (Status.OOM, False, True)
        assert "memory limit 128 MiB" in hog.feedback
        slow = s.step(commands=[["sleep", "30"]], timeout_s=1)
        assert (slow.status, slow.commands[0].timed_out) == (Status.TIMEOUT, True)
        assert "timed out after 1 s" in slow.feedback, slow.feedback  # the call's, not 5 s
        assert s.exec(["cat", "keep.txt"]).stdout == "kept\n"


@pytest.fixture(scope="module")
def killable() -> Iterator[tuple[LocalTwin, Client]]:
    with twin_and_client(workers=2, heartbeat_s=LOST_WORKER_HEARTBEAT_S) as both:
        yield both


def test_every_worker_killed_mid_session_and_the_episode_still_grades_right(
    killable: tuple[LocalTwin, Client],
) -> None:
    twin, client = killable
    assert twin.pool is not None
    with client.session(TASK) as s:
        s.write_files({"solution.py": WRONG})
        s.write_files({"solution.py": CORRECT})  # durable before the reply: the checkpoint
        killed: list[int] = []

        def kill_soon() -> None:
            time.sleep(1.0)
            killed.extend(twin.pool.kill())  # type: ignore[union-attr]

        threading.Thread(target=kill_soon, daemon=True).start()
        lost = s.step(commands=[["sh", "-c", "echo partial > partial.txt; sleep 5"]])
        assert len(killed) == 2
        assert (lost.status, lost.loss_mask, lost.checkpoint) == (
            Status.SANDBOX_ERROR,
            True,
            s.checkpoint,
        )
        after = s.exec(["cat", "solution.py"])  # on a replacement worker, from the checkpoint
        assert s.failovers == 1 and after.stdout == CORRECT
        assert s.exec(["test", "-e", "partial.txt"]).exit_code == 1  # the lost call's effect
        assert s.grade(timeout=120).reward == 1.0


def test_an_idle_session_frees_its_slot_and_the_next_call_restores_it(client: Client) -> None:
    with client.session(TASK, idle_release_s=1) as s:
        first = s.step(files={"state.txt": "1\n"}, commands=[["true"]])
        assert first.restored_s is None
        time.sleep(3)  # released: checkpointed, slot given back
        again = s.step(commands=[["cat", "state.txt"]])
        assert again.restored_s is not None and again.commands[0].stdout == "1\n"
        assert again.worker == first.worker  # the same host, its slot taken again


def test_a_resent_call_returns_its_recorded_result_and_never_runs_twice(client: Client) -> None:
    twin = twin_of(client)
    sqs = twin.client("sqs")
    with client.session(TASK) as s:
        once = s.step(commands=[["sh", "-c", "echo ran >> log.txt; cat log.txt"]])
        time.sleep(RECEIVE_WAIT_S + 1)  # the client's reply receivers have stopped
        again = Call(
            session_id=s.session_id, reply_url=s.aio._reply_url, seq=once.seq, op="exec",
            commands=[["sh", "-c", "echo ran >> log.txt"]],
        )  # fmt: skip
        sqs.send_message(QueueUrl=s.aio._inbox, MessageBody=again.model_dump_json())
        deadline = time.monotonic() + 30
        replies: list[Reply] = []
        while not any(r.kind == "result" for r in replies):  # no call of the client's waits
            assert time.monotonic() < deadline, "the re-sent call got no reply"
            got = sqs.receive_message(QueueUrl=s.aio._reply_url, WaitTimeSeconds=1)
            replies += [Reply.model_validate_json(m["Body"]) for m in got.get("Messages", [])]
        (result,) = [r for r in replies if r.kind == "result"]
        assert result.result is not None and result.result.commands == once.commands
        assert s.read_file("log.txt") == b"ran\n"


def test_a_grade_runs_once_for_one_state(client: Client) -> None:
    twin = twin_of(client)
    with client.session(TASK) as s:
        s.write_files({"solution.py": CORRECT})
        first, second = s.grade(timeout=120), s.grade(timeout=120)
        assert first == second and first.reward == 1.0
        name = f"{s.session_id}-grade-{s.aio.seq}"
        sfn = twin.client("stepfunctions")
        executions = sfn.list_executions(stateMachineArn=twin.output(c.OUTPUT_ROLLOUT_ARN))
        assert [e["name"] for e in executions["executions"]].count(name) == 1
        s.write_files({"solution.py": WRONG})  # another state: another grade
        assert s.grade(timeout=120).reward == 0.5


TRAINER = """
import json, sys, boto3
from trialbox.sdk import Client, Resources
from trialbox.models import Task
outputs, endpoint, task = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local",
                                region_name="us-east-1")
client = Client(Resources.from_outputs(outputs), endpoint_url=endpoint, session=session)
s = client.session(Task.model_validate(task), ttl_s=6, idle_release_s=600)
s.step(commands=[["sh", "-c", "sleep 600 & echo started"]])
print(s.aio._reply_url, flush=True)
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_trainer(twin: LocalTwin) -> str:
    """Run TRAINER until it SIGKILLs itself mid-session; its client's reply queue."""
    argv = [sys.executable, "-c", TRAINER, json.dumps(twin.outputs), twin.endpoint_url,
            json.dumps(ADD_TASK)]  # fmt: skip
    trainer = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert trainer.returncode == -9, trainer.stderr
    return trainer.stdout.strip()


def _exists(sqs: object, url: str) -> bool:
    name = url.rsplit("/", 1)[-1]
    return url in sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", [])  # type: ignore[attr-defined]


def test_a_killed_trainers_session_ends_at_its_ttl_and_leaves_nothing(client: Client) -> None:
    twin = twin_of(client)
    reply_queue = _killed_trainer(twin)
    config = SandboxConfig.from_env()
    pool = SlotPool(config, lambda _: None, lambda _: None, lambda _: None)
    uids = tuple(uid for i in range(config.slots) for uid in pool.slot(i).uids)
    assert processes_of(uids) == []  # the background sleep went as its call returned

    def held() -> int:
        with pool.idle(list(range(config.slots))) as idle:
            return config.slots - len(idle)

    assert held() == 1  # the session's, until its TTL (6 s)
    deadline = time.monotonic() + 20
    while held():
        assert time.monotonic() < deadline, "the session outlived its TTL"
        time.sleep(0.5)
    assert _exists(twin.client("sqs"), reply_queue)  # the reaper's, once its tag passes


def test_a_session_whose_trainer_and_worker_both_died_leaves_no_queue(client: Client) -> None:
    """Nobody is left to delete the trainer's reply queue: the scheduled reaper deletes it
    once its tag (the session's TTL, rounded up) passes. The dead workers' inboxes are the
    reaper's too, an hour on (their tags are renewed while they live)."""
    twin = twin_of(client)
    reply_queue = _killed_trainer(twin)
    assert twin.pool is not None
    twin.pool.kill()  # the host goes too, before the TTL
    sqs = twin.client("sqs")
    assert _exists(sqs, reply_queue)
    deadline = time.monotonic() + 6 + REPLY_TAG_STEP_S + GRACE_S + SCHEDULE_CAP_S + 20
    while _exists(sqs, reply_queue):
        assert time.monotonic() < deadline, "the reaper left the trainer's reply queue"
        time.sleep(1)
    twin.pool.wait_for(twin.workers)
