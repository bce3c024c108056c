"""A session's workspace (trialbox/sandbox/session.py) on a real bwrap slot: a restore that
cannot fit is the policy's (WorkspaceError, told back, never a masked sandbox_error), as a
grade scores the same state, and a restore keeps a file's hard links and times."""

from __future__ import annotations

import io
import tarfile

import pytest

from trialbox.models import Limits
from trialbox.sandbox.runner import Runner
from trialbox.sandbox.session import SessionWorkspace, WorkspaceError

ONE_MIB = Limits(disk_mb=1, memory_mb=64)


def archive(count: int) -> bytes:
    """`count` one-byte files, as a checkpoint from before issue 22 stored a hard link's
    names: a few KiB of archive, a page of tmpfs each."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i in range(count):
            member = tarfile.TarInfo(f"l{i}")
            member.size = 1
            tar.addfile(member, io.BytesIO(b"x"))
    return buffer.getvalue()


def test_a_checkpoint_past_the_workspace_is_the_policys_error(runner: Runner) -> None:
    with pytest.raises(WorkspaceError, match="the last checkpoint does not fit the workspace"):
        SessionWorkspace(runner, {}, ONE_MIB, archive(300))  # 300 pages: 1.2 MiB


def test_a_restore_keeps_hard_links_and_checkpoints_to_the_same_bytes(runner: Runner) -> None:
    first = SessionWorkspace(runner, {"a.txt": "x\n"}, ONE_MIB)
    try:
        made = first.exec(["sh", "-c", "for i in $(seq 1000); do ln a.txt l$i; done"])
        assert made.exit_code == 0, made.stderr
        saved = first.checkpoint()
        assert saved is not None
        assert first.checkpoint() in (None, saved)  # unchanged: not built again once settled
    finally:
        first.release()
    second = SessionWorkspace(runner, {}, ONE_MIB, saved)  # 1,000 pages if copied: 4 MiB
    try:
        assert second.exec(["stat", "-c", "%h", "a.txt"]).stdout == "1001\n"
        assert second.checkpoint() == saved
    finally:
        second.release()
