"""What a workspace holds, built and written by short-lived child processes in the slot's own
accounting: a session's checkpoint (`build`), and a restore or the worker's file writes
(`unpack`). Compressing costs the session's own CPU, not the worker's; and the pages a restore
or a write puts on the workspace's tmpfs are charged to the slot (on bwrap, a tmpfs page counts
in the memory cgroup of the process that wrote it), as the policy's own writes are: what the
workspace holds counts against memory_mb whoever wrote it. The backend's `accounting` prefix
puts the child in the slot's accounting before it starts (on bwrap, the slot's cgroup: its
CPU counts in the slot's cpuacct, under its cpu quota, and its memory under memory_mb), and on
both backends it runs under the CPU budget of one of the session's commands (RLIMIT_CPU; on
rlimit, its CPU is the rusage the child reports). The worker only moves bytes on a pipe.

On rlimit there is no cgroup to charge: the watchdog (trialbox.sandbox.watchdog) counts the
tmpfs files the slot's uids own only as the machine's Shmem grows while a command runs, so a
file already in the workspace when a command starts counts for neither path alike, whether an
earlier command wrote it or a restore did (an unpacked file is the agent uid's).

The child is `python -m trialbox.sandbox.checkpoint_child build ROOT MAX_BYTES` (the archive on
its stdout) or `... unpack ROOT UID MAX_BYTES gz|tar` (the archive on its stdin); it exits
TOO_LARGE, BAD or FULL with the reason on stderr.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trialbox
from trialbox.errors import SandboxError
from trialbox.sandbox.checkpoints import (
    BadCheckpoint,
    CheckpointTooLarge,
    restore,
    write_checkpoint,
)

if TYPE_CHECKING:
    from trialbox.models.common import FileContent
    from trialbox.models.limits import Limits

TOO_LARGE = 3  # the child's exit status for CheckpointTooLarge
BAD = 4  # for any other BadCheckpoint
FULL = 5  # for a workspace that filled up (ENOSPC and its kin)
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
KILLED = (signal.SIGKILL, signal.SIGXCPU)  # RLIMIT_CPU, or the slot's memory limit
PACKAGE_ROOT = str(Path(trialbox.__file__).resolve().parents[1])


@dataclass(frozen=True)
class Built:
    data: bytes
    cpu_s: float  # the child's user + system CPU (its rusage)


def cpu_budget_s(limits: Limits) -> int:
    """A child's CPU budget: one command's (its RLIMIT_CPU)."""
    return math.ceil(limits.timeout_s * limits.cpus) + 1


def build(root: Path, max_bytes: int, cpu_budget_s: int, accounting: list[str]) -> Built:
    """The workspace's archive (`write_checkpoint`), built by a child started as
    `accounting + [the child]`. Raises CheckpointTooLarge for a workspace a checkpoint may not
    store, or one the session's own limits cannot archive (its CPU budget, its memory): both
    are the policy's. Any other failure of the child is a SandboxError."""
    code, data, reason, cpu_s = _child(["build", str(root), str(max_bytes)], cpu_budget_s,
                                       accounting, None)  # fmt: skip
    if code == 0:
        return Built(data, cpu_s)
    raise _failure(code, reason, "archiving", cpu_budget_s)


def unpack(
    root: Path,
    archive: bytes,
    uid: int,
    max_bytes: int,
    cpu_budget_s: int,
    accounting: list[str],
    compressed: bool = True,
) -> float:
    """`checkpoints.restore` of `archive` (a checkpoint, or `files_archive`'s plain tar) under
    `root`, owned by uid, by a child started as `accounting + [the child]`: its tmpfs pages,
    CPU and memory are the slot's, and the worker only writes a pipe. Returns the child's CPU.
    Raises CheckpointTooLarge when the files do not fit the workspace or the session's own
    limits (its CPU budget, its memory_mb) cannot write them, BadCheckpoint for an archive that
    is not one, OSError (ENOSPC) for a workspace that filled up, SandboxError otherwise."""
    argv = ["unpack", str(root), str(uid), str(max_bytes), "gz" if compressed else "tar"]
    code, _, reason, cpu_s = _child(argv, cpu_budget_s, accounting, archive)
    if code == 0:
        return cpu_s
    if code == BAD:
        raise BadCheckpoint(reason.splitlines()[-1] if reason else "not a checkpoint")
    if code == FULL:
        raise OSError(errno.ENOSPC, reason.splitlines()[-1] if reason else "no space left")
    raise _failure(code, reason, "writing the workspace's files", cpu_budget_s)


def files_archive(files: dict[str, FileContent]) -> bytes:
    """Files to write (path -> content) as a plain tar for `unpack`: each with its mode, and
    now as its time."""
    from trialbox.models.common import file_bytes, file_mode  # the child never needs them

    out = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel, content in files.items():
            data = file_bytes(content)
            member = tarfile.TarInfo(rel)
            member.size, member.mode, member.mtime = len(data), file_mode(content), now
            tar.addfile(member, io.BytesIO(data))
    return out.getvalue()


def _failure(code: int, reason: str, doing: str, cpu_budget_s: int) -> Exception:
    if code == TOO_LARGE:
        return CheckpointTooLarge(reason.splitlines()[-1] if reason else "too large")
    if -code in KILLED:
        return CheckpointTooLarge(
            f"{doing} took more than the session's own limits allow (a command's "
            f"{cpu_budget_s} s of CPU, or its memory_mb)"
        )
    return SandboxError(f"the checkpoint's child failed (exit {code}): {reason[-2000:]}")


def _child(
    args: list[str], cpu_budget_s: int, accounting: list[str], stdin: bytes | None
) -> tuple[int, bytes, str, float]:
    """Run the child under `accounting` and a CPU budget: (exit code, its stdout when nothing
    goes to its stdin, its stderr, its CPU from its rusage)."""
    argv = [*accounting, "prlimit", f"--cpu={cpu_budget_s}", "--core=0", "--"]
    argv += [sys.executable, "-m", __name__, *args]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            argv,
            bufsize=0,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE if stdin is None else subprocess.DEVNULL,
            stderr=errors,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": PACKAGE_ROOT},
            cwd="/",
            start_new_session=True,
        )
        data = b""
        try:
            if stdin is None:
                assert proc.stdout is not None
                with proc.stdout:
                    data = proc.stdout.read()
            else:
                assert proc.stdin is not None
                with proc.stdin, contextlib.suppress(BrokenPipeError):  # its status says why
                    view = memoryview(stdin)
                    while view:
                        view = view[proc.stdin.write(view) or 0 :]
        except BaseException:
            proc.kill()  # nothing is left running behind a failed pipe
            proc.wait()
            raise
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, with its rusage
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        reason = errors.read().decode(errors="replace").strip()
    return code, data, reason, usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "build":
            write_checkpoint(Path(argv[1]), sys.stdout.buffer, int(argv[2]))
            sys.stdout.buffer.flush()
        else:  # unpack ROOT UID MAX_BYTES gz|tar
            uid = int(argv[2])
            restore(Path(argv[1]), sys.stdin.buffer, uid, uid, int(argv[3]),
                    compressed=argv[4] == "gz")  # fmt: skip
    except CheckpointTooLarge as exc:
        print(exc, file=sys.stderr)
        return TOO_LARGE
    except BadCheckpoint as exc:
        print(exc, file=sys.stderr)
        return BAD
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        print(exc.strerror, file=sys.stderr)
        return FULL
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
