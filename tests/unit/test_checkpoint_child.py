"""A session's checkpoint built by a child process (trialbox/sandbox/checkpoint_child.py): the
same archive as in the worker, its CPU the child's own (its rusage), and every way the child can
end told apart: a workspace too large and a child the session's limits killed are the policy's,
anything else the platform's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.processes import children_of, cmdline
from trialbox.errors import SandboxError
from trialbox.sandbox.checkpoint_child import build
from trialbox.sandbox.checkpoints import CheckpointTooLarge, checkpoint

NO_ACCOUNT: tuple[Path, ...] = ()


def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    text = b"".join(b"line %d of some source text, words words\n" % i for i in range(100_000))
    (root / "pkg" / "text.txt").write_bytes(text)
    (root / "noise").write_bytes(os.urandom(1 << 20))
    (root / "link").symlink_to("pkg/text.txt")
    return root


def test_the_child_builds_the_workers_archive_on_its_own_cpu(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    started = time.thread_time()
    built = build(root, 64 << 20, 10, NO_ACCOUNT)
    worker_s = time.thread_time() - started
    assert built.data == checkpoint(root, 64 << 20)
    assert built.cpu_s > 0.02  # interpreter, walk and gzip: the child's rusage
    assert worker_s < built.cpu_s  # the worker reads a socket


def zygote() -> int:
    (pid,) = [pid for pid in children_of(os.getpid()) if "trialbox.sandbox.zygote" in cmdline(pid)]
    return pid


def test_a_zygote_that_died_is_replaced_and_so_is_one_that_died_with_the_request(
    tmp_path: Path,
) -> None:
    """Killed between two checkpoints, or after a request reached it and before it forked
    (stopped, then killed): the checkpoint is built by a new zygote all the same."""
    root = workspace(tmp_path)
    expected = checkpoint(root, 64 << 20)
    assert build(root, 64 << 20, 10, NO_ACCOUNT).data == expected
    os.kill(zygote(), signal.SIGKILL)
    assert build(root, 64 << 20, 10, NO_ACCOUNT).data == expected
    stopped = zygote()
    os.kill(stopped, signal.SIGSTOP)
    built: list[bytes] = []
    thread = threading.Thread(target=lambda: built.append(build(root, 64 << 20, 10, ()).data))
    thread.start()
    time.sleep(0.5)  # the request waits in the stopped zygote's socket
    os.kill(stopped, signal.SIGKILL)
    thread.join(timeout=60)
    assert built == [expected] and zygote() != stopped


def test_a_reason_that_names_a_path_that_is_not_utf8_is_still_the_refusal(tmp_path: Path) -> None:
    """A policy's directory named b"\\xff", 65 levels deep under it, past what a checkpoint
    stores, with 3 MiB archived before it: refused with its reason, never a cut-off archive
    returned as built (a helper whose reason could not be written once exited 0)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(3 << 20))
    deep = os.fsencode(root) + b"/\xff"
    os.mkdir(deep)
    for _ in range(65):
        deep += b"/d"
        os.mkdir(deep)
    with pytest.raises(CheckpointTooLarge) as in_worker:
        checkpoint(root, 64 << 20)
    with pytest.raises(CheckpointTooLarge) as in_helper:
        build(root, 64 << 20, 10, NO_ACCOUNT)
    assert "deeper than 64 directory levels" in str(in_helper.value), in_worker.value


def test_a_workspace_too_large_is_refused_with_the_childs_reason(tmp_path: Path) -> None:
    with pytest.raises(CheckpointTooLarge, match="more than 65536 bytes of files"):
        build(workspace(tmp_path), 64 << 10, 10, NO_ACCOUNT)


def helpers() -> list[int]:
    """The zygote's helpers: this process's zygote, its waiters, and theirs."""
    zygotes = [pid for pid in children_of(os.getpid()) if "trialbox.sandbox.zygote" in cmdline(pid)]
    return [
        helper
        for zygote in zygotes
        for waiter in children_of(zygote)
        for helper in children_of(waiter)
    ]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGXCPU])
def test_a_child_the_sessions_limits_killed_is_the_policys(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGKILL (the slot's memory limit, or RLIMIT_CPU's hard limit) or SIGXCPU (its soft
    limit): the session's own limits, so the policy's. The helper is held where it joins its
    accounting (a FIFO nobody reads, for a procs file), and killed there."""
    root = workspace(tmp_path)
    held = tmp_path / "cgroup.procs"
    os.mkfifo(held)
    failures: list[BaseException] = []

    def archive() -> None:
        try:
            build(root, 64 << 20, 10, (held,))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=archive)
    thread.start()
    deadline = time.monotonic() + 30
    while not (children := helpers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) == 1, children
    os.kill(children[0], signum)
    thread.join(timeout=30)
    assert len(failures) == 1 and isinstance(failures[0], CheckpointTooLarge), failures
    assert "the session's own limits allow" in str(failures[0])


def test_a_child_that_fails_otherwise_is_the_platforms(tmp_path: Path) -> None:
    """One that cannot join the slot's accounting, say."""
    missing = tmp_path / "gone" / "cgroup.procs"
    with pytest.raises(SandboxError, match=r"child failed \(exit 125\): joining the slot"):
        build(workspace(tmp_path), 64 << 20, 10, (missing,))


def deep_archive(files: int) -> bytes:
    """`files` empty files in a directory 20 levels of 200-byte names deep: 4 KiB a path."""
    import io
    import tarfile

    deep = "/".join(f"{i:02d}" + "d" * 198 for i in range(20))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for i in range(files):
            tar.addfile(tarfile.TarInfo(f"{deep}/f{i}"), io.BytesIO(b""))
    return out.getvalue()


def test_a_restore_holds_one_member_at_a_time(tmp_path: Path) -> None:
    """A TarFile keeps every member it read (issue 22: +324 MiB of worker RSS for 20,000 long
    names); the restore streams them, whatever their number."""
    # In a process of its own: tracemalloc counts every thread's allocations, and an xdist
    # worker may run a twin's threads beside the test (a CI run once saw 9 MiB).
    measure = (
        "import os, sys, tracemalloc\n"
        "from pathlib import Path\n"
        "from trialbox.sandbox.checkpoints import restore\n"
        "data = sys.stdin.buffer.read()\n"
        "tracemalloc.start()\n"
        "restore(Path(sys.argv[1]), data, os.getuid(), os.getgid(), 64 << 20)\n"
        "print(tracemalloc.get_traced_memory()[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, str(tmp_path)],
        input=deep_archive(3000), capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    peak = int(done.stdout)
    assert len(os.listdir(tmp_path / "/".join(f"{i:02d}" + "d" * 198 for i in range(20)))) == 3000
    assert peak < 4 << 20, peak  # 3,000 members kept: 15 MiB
