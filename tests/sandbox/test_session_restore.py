"""A session's workspace (trialbox/sandbox/session.py) on a real bwrap slot: a restore that
cannot fit is the policy's (WorkspaceError, told back, never a masked sandbox_error), as a
grade scores the same state, a restore keeps a file's hard links and times, and a checkpoint's
compression is the session's own CPU (the slot's cgroup counts it), not the worker's."""

from __future__ import annotations

import io
import resource
import tarfile
import time

import pytest

from trialbox.models import Limits
from trialbox.sandbox.cgroups import cgroup_class
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


def test_a_checkpoints_compression_is_the_sessions_own_cpu(runner: Runner) -> None:
    """The archive's CPU is counted in the slot's cgroup (cpuacct grows by it) and spent by a
    child of the worker, not the worker's thread (issue 22: 2.4 s of worker CPU, outside
    every quota, for a 0.3 s step)."""
    config = runner.config
    limits = Limits(disk_mb=24, memory_mb=128)
    digits = "\n".join(str(i) for i in range(2_000_000))  # 15 MiB that level-1 gzip works on
    workspace = SessionWorkspace(runner, {}, limits)
    try:
        assert workspace.exec(["true"]).exit_code == 0
        workspace.write({"digits.txt": digits})  # written by the worker: no CPU of the slot's
        cgroup = cgroup_class(config.cgroup_root)(
            config.cgroup_root, config.cgroup_parent, workspace.slot.cgroup_name
        )
        slot_before = cgroup.stats().cpu_s
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        thread_before = time.thread_time()
        assert workspace.checkpoint() is not None
        worker_s = time.thread_time() - thread_before
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_s = (children.ru_utime - children_before.ru_utime) + (
            children.ru_stime - children_before.ru_stime
        )
        slot_s = cgroup.stats().cpu_s - slot_before
    finally:
        workspace.release()
    archive_s = worker_s + child_s
    print(f"checkpoint: worker {worker_s:.3f} s, child {child_s:.3f} s, slot cgroup {slot_s:.3f} s")
    assert archive_s > 0.05, (worker_s, child_s)  # the archive's cost, wherever it ran
    assert slot_s >= 0.8 * archive_s, (slot_s, worker_s, child_s)  # the slot's CPU grew by it
    assert worker_s < 0.2 * archive_s, (worker_s, child_s)  # the worker only reads the pipe
