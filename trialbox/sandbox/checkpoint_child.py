"""What a workspace holds, built and written by short-lived child processes in the slot's own
accounting: a session's checkpoint (`build`), and a restore or the worker's file writes
(`unpack`). Compressing costs the session's own CPU, not the worker's; and the pages a restore
or a write puts on the workspace's tmpfs are charged to the slot (on bwrap, a tmpfs page counts
in the memory cgroup of the process that wrote it), as the policy's own writes are: what the
workspace holds counts against memory_mb whoever wrote it. The child joins the backend's
`accounting` (on bwrap, the slot's cgroup: its CPU counts in the slot's cpuacct, under its cpu
quota, and its memory under memory_mb) before it reads a byte, and on both backends it runs
under the CPU budget of one of the session's commands (RLIMIT_CPU; on rlimit, its CPU is the
rusage the child reports). The worker only moves bytes on a socket.

On rlimit there is no cgroup to charge: the watchdog (trialbox.sandbox.watchdog) counts the
tmpfs files the slot's uids own only as the machine's Shmem grows while a command runs, so a
file already in the workspace when a command starts counts for neither path alike, whether an
earlier command wrote it or a restore did (an unpacked file is the agent uid's).

Each child is a fork of the worker's zygote (trialbox.sandbox.zygote), which has this module
imported: a new interpreter per child cost the worker about 70 ms of CPU per sample. The child
builds the archive onto its data socket (`build`) or unpacks it from there (`unpack`); it ends
with TOO_LARGE, BAD or FULL, with the reason on its report socket.
"""

from __future__ import annotations

import errno
import io
import math
import signal
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trialbox.errors import SandboxError
from trialbox.sandbox.checkpoints import (
    BadCheckpoint,
    CheckpointTooLarge,
    restore,
    write_checkpoint,
)
from trialbox.sandbox.zygote import Zygote

if TYPE_CHECKING:
    from trialbox.models.common import FileContent
    from trialbox.models.limits import Limits

TOO_LARGE = 3  # the child's exit status for CheckpointTooLarge
BAD = 4  # for any other BadCheckpoint
FULL = 5  # for a workspace that filled up (ENOSPC and its kin)
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
KILLED = (signal.SIGKILL, signal.SIGXCPU)  # RLIMIT_CPU, or the slot's memory limit
ZYGOTE = Zygote()  # this process's: its children are forks of it


@dataclass(frozen=True)
class Built:
    data: bytes
    cpu_s: float  # the child's user + system CPU (its rusage)


def cpu_budget_s(limits: Limits) -> int:
    """A child's CPU budget: one command's (its RLIMIT_CPU)."""
    return math.ceil(limits.timeout_s * limits.cpus) + 1


def build(root: Path, max_bytes: int, cpu_budget_s: int, accounting: tuple[Path, ...]) -> Built:
    """The workspace's archive (`write_checkpoint`), built by a child that joined `accounting`
    (the cgroup procs files) first. Raises CheckpointTooLarge for a workspace a checkpoint may
    not store, or one the session's own limits cannot archive (its CPU budget, its memory):
    both are the policy's. Any other failure of the child is a SandboxError."""
    code, data, reason, cpu_s = ZYGOTE.run(["build", str(root), str(max_bytes)], cpu_budget_s,
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
    accounting: tuple[Path, ...],
    compressed: bool = True,
) -> float:
    """`checkpoints.restore` of `archive` (a checkpoint, or `files_archive`'s plain tar) under
    `root`, owned by uid, by a child that joined `accounting` first: its tmpfs pages,
    CPU and memory are the slot's, and the worker only writes a socket. Returns the child's CPU.
    Raises CheckpointTooLarge when the files do not fit the workspace or the session's own
    limits (its CPU budget, its memory_mb) cannot write them, BadCheckpoint for an archive that
    is not one, OSError (ENOSPC) for a workspace that filled up, SandboxError otherwise."""
    argv = ["unpack", str(root), str(uid), str(max_bytes), "gz" if compressed else "tar"]
    code, _, reason, cpu_s = ZYGOTE.run(argv, cpu_budget_s, accounting, archive)
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


def work(argv: list[str], stream: IO[bytes], said: IO[str]) -> int:
    """A child's work (`build ROOT MAX_BYTES` or `unpack ROOT UID MAX_BYTES gz|tar`) on its
    data stream; its exit code."""
    try:
        if argv[0] == "build":
            write_checkpoint(Path(argv[1]), stream, int(argv[2]))
            stream.flush()
        else:  # unpack ROOT UID MAX_BYTES gz|tar
            uid = int(argv[2])
            restore(Path(argv[1]), stream, uid, uid, int(argv[3]),
                    compressed=argv[4] == "gz")  # fmt: skip
    except CheckpointTooLarge as exc:
        print(exc, file=said)
        return TOO_LARGE
    except BadCheckpoint as exc:
        print(exc, file=said)
        return BAD
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        print(exc.strerror, file=said)
        return FULL
    return 0
