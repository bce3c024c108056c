"""The wipe between two jobs on one rlimit worker, and the check that it was complete.

The rlimit backend has no private /tmp, IPC namespace or mount namespace: whatever a job's
slot uids leave in a shared writable place would reach the next job on the same task. A slot
uid can write only where the container is writable, so the wipe covers every writable mount
the container has (on Fargate: the read-only root's volumes, /dev, /dev/shm, /dev/mqueue),
plus the world-writable directories of the root when the root is writable (a dev host):
- every process of the slot uids (SIGKILL from root, see processes);
- every file, directory, fifo, socket or POSIX message queue they own there;
- their SysV shared memory, semaphores and message queues, and their persistent keyrings;
- the session keyring every command inherits is sealed at start (nobody may add to it).
`residue` looks for each of those again; the worker takes no further job unless it is empty.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from trialbox.sandbox import as_uid, processes
from trialbox.sandbox.fs import remove_tree

MOUNTINFO = Path("/proc/self/mountinfo")
# Kernel interfaces, not storage: nothing a uid writes there outlives its processes.
PSEUDO = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
        "bpf", "pstore", "configfs", "fusectl", "binfmt_misc", "autofs", "efivarfs", "nsfs",
    }
)  # fmt: skip
# World-writable places on a writable root (a dev host; the Fargate root is read-only).
ROOT_SHARED = ("/tmp", "/var/tmp", "/run/lock", "/var/lock")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def writable_places(mountinfo: str) -> list[Path]:
    """Mount points a slot uid could leave something on, from /proc/self/mountinfo text."""
    places: list[Path] = []
    root_writable = False
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()[0]
        point, options = _unescape(fields[4]), fields[5].split(",")
        if "rw" not in options or fstype in PSEUDO:
            continue
        if point == "/":
            root_writable = True
            continue
        places.append(Path(point))
    if root_writable:
        places += [Path(p) for p in ROOT_SHARED if Path(p).is_dir() and not Path(p).is_symlink()]
    return sorted(set(places))


def _owned(places: list[Path], uids: tuple[int, ...]) -> list[Path]:
    """Entries owned by `uids` under each place, on the place's own file system only (a
    submount is a place of its own). A directory they own is listed, not entered."""
    found: list[Path] = []
    for place in places:
        try:
            device = os.lstat(place).st_dev
        except OSError:
            continue
        stack = [place]
        while stack:
            directory = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if info.st_uid in uids or info.st_gid in uids:
                        found.append(Path(entry.path))
                    elif stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                        stack.append(Path(entry.path))
    return found


def wipe(uids: tuple[int, ...], places: list[Path]) -> None:
    """Remove everything the uids left (kill first: nothing may write while it goes)."""
    processes.kill_all(uids)
    for path in _owned(places, uids):
        with contextlib.suppress(OSError):  # `residue` reports whatever stayed
            remove_tree(path)
    as_uid.remove_ipc_and_keys(uids)


def wipe_outside(uids: tuple[int, ...], places: list[Path], keep: Path) -> None:
    """After a command of a sandbox: kill what it left running and remove what it left
    anywhere but under `keep` (the slot's own tree: its workspaces), SysV IPC included, as
    bwrap's per-command /tmp, /dev/shm and IPC namespace vanish with the command."""
    processes.kill_all(uids)
    outside = [place for place in places if not place.is_relative_to(keep)]
    for path in _owned(outside, uids):
        if not path.is_relative_to(keep):
            with contextlib.suppress(OSError):
                remove_tree(path)
    as_uid.remove_ipc_and_keys(uids)


def residue(uids: tuple[int, ...], places: list[Path]) -> list[str]:
    """What the uids still have anywhere a later job could see it, in words; [] when clean."""
    found = [f"process {pid}" for pid in processes.processes_of(uids)]
    found += [f"file {path}" for path in _owned(places, uids)]
    found += as_uid.ipc_and_keys_left(uids)
    if keys := as_uid.session_keys():
        found.append(f"{keys} keys in the session keyring every command inherits")
    return found
