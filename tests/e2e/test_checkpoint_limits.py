"""Checkpoints restore what they store (issue 22), on the twin's bwrap workers: a workspace
state the policy built is either restored whole within the session's own limits, or refused
at the call that built it as the policy's error (never a masked sandbox_error later, on a
restore, a fork or a grade); and a session's checkpoint storage is bounded.

Limits are scaled down (a 16 MiB disk, a 4 MiB one for the quota) to keep each test fast."""

from __future__ import annotations

import time

from tests.e2e.test_sessions_redteam import (
    IDLE_S,
    RELEASED_S,
    TASK,
    checkpoint_members,
    raw_read,
)
from tests.support.tasks import CORRECT
from trialbox.models import Status
from trialbox.models.report import CommandResult
from trialbox.sdk import Client, Session

SMALL = {"disk_mb": 16, "memory_mb": 256}
LINKS = 6000  # 6,000 pages of 4 KiB = 23 MiB if restored as separate files: past 16 MiB


def shell(s: Session, script: str) -> CommandResult:
    result = s.exec(["sh", "-c", script], timeout_s=20)
    assert isinstance(result, CommandResult), result
    return result


def test_hard_links_survive_an_idle_release_a_fork_and_a_grade(client: Client) -> None:
    with client.session(TASK, idle_release_s=IDLE_S, limits=SMALL) as s:
        s.write_files({"solution.py": CORRECT})
        # One process makes the links (6,000 `ln` forks passed the 10 s limit on a loaded
        # machine).
        links = f"import os; [os.link('one', f'd/{{i}}') for i in range(1, {LINKS + 1})]"
        made = shell(s, f'echo x > one; mkdir d; python -c "{links}"')
        assert made.exit_code == 0, made.stderr
        members = checkpoint_members(client, s.checkpoint or "")
        assert members["one"].islnk() and members["one"].linkname == "d/1"  # "d" < "one"
        assert sorted(name for name, m in members.items() if m.isreg()) == ["d/1", "solution.py"]
        time.sleep(RELEASED_S)  # released: the next call restores the checkpoint
        after = s.step(commands=[["sh", "-c", "stat -c %h one; ls d | wc -l; cat d/77"]])
        assert (after.status, after.loss_mask, after.error) == (Status.SUCCEEDED, False, None)
        assert after.restored_s is not None
        assert after.commands[0].stdout == f"{LINKS + 1}\n{LINKS}\nx\n"
        (fork,) = s.fork(1)
        try:
            assert shell(fork, "stat -c %h one").stdout == f"{LINKS + 1}\n"
        finally:
            fork.close()
        graded = s.grade(timeout=120)
        assert (graded.status, graded.reward) == (Status.SUCCEEDED, 1.0), graded.feedback


def test_checkpoint_storage_is_bounded_per_session(client: Client) -> None:
    """4 x disk_mb stored over the session's life (16 MiB here): past it, a call that
    changes the workspace is the policy's error and is undone; one that does not, goes on."""
    with client.session(TASK, idle_release_s=60, limits={"disk_mb": 4, "memory_mb": 256}) as s:
        s.write_files({"keep.txt": "kept\n"})
        refused = None
        for call in range(1, 9):  # 3 MiB of fresh random bytes a call: the 6th is past 16 MiB
            result = s.step(commands=[["sh", "-c", "head -c 3000000 /dev/urandom > noise"]])
            assert (result.status, result.loss_mask) == (Status.SUCCEEDED, False)
            if result.error is not None:
                refused = (call, result.error)
                break
        assert refused is not None and refused[0] == 6, refused
        assert "checkpoint storage" in refused[1] and "16 MiB" in refused[1]
        assert "the call is undone" in refused[1]
        still = s.step(commands=[["cat", "keep.txt"]])  # changes nothing: no new checkpoint
        assert (still.status, still.error, still.commands[0].stdout) == (
            Status.SUCCEEDED,
            None,
            "kept\n",
        )


def test_a_scored_failure_stays_scored_when_the_call_is_undone(client: Client) -> None:
    """A call whose workspace cannot be checkpointed (a 1 GiB sparse file) is undone, but its
    status is still the worst of its commands', unmasked: a refused checkpoint never turns a
    scored timeout into `succeeded`."""
    with client.session(TASK, limits=SMALL) as s:
        script = "truncate -s 1G big; sleep 30"
        result = client._loop.run(
            s.aio._next(op="exec", commands=[["true"], ["sh", "-c", script]], timeout_s=1)
        )
        assert (result.status, result.loss_mask) == (Status.TIMEOUT, False), result
        assert [c.status for c in result.commands] == [Status.SUCCEEDED, Status.TIMEOUT]
        assert result.error is not None and "the call is undone" in result.error
        after = shell(s, "ls")  # the call was undone: no sparse file left
        assert "big" not in after.stdout.split()


def test_reading_what_is_not_a_regular_file_is_the_policys_error(client: Client) -> None:
    with client.session(TASK) as s:
        made = shell(s, "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
        assert made.exit_code == 0, made.stderr
        result = raw_read(client, s, "sock")
        assert (result.status, result.loss_mask) == (Status.SUCCEEDED, False), result.error
        assert result.error is not None and "not a regular file" in result.error
