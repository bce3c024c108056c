"""A session's checkpoint built in a short-lived child process, so that compressing it costs the
session's own CPU, not the worker's: the backend's `accounting` prefix puts the child in the
slot's accounting before it starts (on bwrap, the slot's cgroup: its CPU counts in the slot's
cpuacct, under its cpu quota, and its memory under memory_mb), and on both backends it runs
under the CPU budget of one of the session's commands (RLIMIT_CPU; on rlimit, its CPU is the
rusage `build` reports). The worker only reads the archive off a pipe.

The child is `python -m trialbox.sandbox.checkpoint_child ROOT MAX_BYTES`: the archive on its
stdout, or exit TOO_LARGE with the reason on stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trialbox
from trialbox.errors import SandboxError
from trialbox.sandbox.checkpoints import CheckpointTooLarge, write_checkpoint

TOO_LARGE = 3  # the child's exit status for CheckpointTooLarge
KILLED = (signal.SIGKILL, signal.SIGXCPU)  # RLIMIT_CPU, or the slot's memory limit
PACKAGE_ROOT = str(Path(trialbox.__file__).resolve().parents[1])


@dataclass(frozen=True)
class Built:
    data: bytes
    cpu_s: float  # the child's user + system CPU (its rusage)


def build(root: Path, max_bytes: int, cpu_budget_s: int, accounting: list[str]) -> Built:
    """The workspace's archive (`write_checkpoint`), built by a child started as
    `accounting + [the child]`. Raises CheckpointTooLarge for a workspace a checkpoint may not
    store, or one the session's own limits cannot archive (its CPU budget, its memory): both
    are the policy's. Any other failure of the child is a SandboxError."""
    argv = [*accounting, "prlimit", f"--cpu={cpu_budget_s}", "--core=0", "--"]
    argv += [sys.executable, "-m", __name__, str(root), str(max_bytes)]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": PACKAGE_ROOT},
            cwd="/",
            start_new_session=True,
        )
        assert proc.stdout is not None
        try:
            with proc.stdout:
                data = proc.stdout.read()
        except BaseException:
            proc.kill()  # nothing is left running behind a failed read
            proc.wait()
            raise
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, with its rusage
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        reason = errors.read().decode(errors="replace").strip()
    if code == 0:
        return Built(data, usage.ru_utime + usage.ru_stime)
    if code == TOO_LARGE:
        raise CheckpointTooLarge(reason.splitlines()[-1] if reason else "too large")
    if -code in KILLED:
        raise CheckpointTooLarge(
            f"archiving the workspace took more than the session's own limits allow (a "
            f"command's {cpu_budget_s} s of CPU, or its memory_mb)"
        )
    raise SandboxError(f"the checkpoint's builder failed (exit {code}): {reason[-2000:]}")


def main(argv: list[str]) -> int:
    root, max_bytes = Path(argv[0]), int(argv[1])
    try:
        write_checkpoint(root, sys.stdout.buffer, max_bytes)
    except CheckpointTooLarge as exc:
        print(exc, file=sys.stderr)
        return TOO_LARGE
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
