"""The clean-up only a slot uid itself may do, and what keeps the runner out of a slot uid's
reach. (Its processes are killed from root: trialbox.sandbox.processes.)

Removing a uid's SysV IPC objects and clearing its keyrings needs either CAP_SYS_ADMIN, which a
Fargate task never has, or being that uid: a forked child switches to the uid, makes only those
syscalls and exits. It never execs, so it never holds the worker's environment as the uid (on
Fargate that holds the task's credentials URI), and it is undumpable. It runs only once every
process of the uid is dead, and the worker waits for it a bounded time: a child that does not
finish (stopped, say) is killed and the clean-up is a SandboxError.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import time
from pathlib import Path

from trialbox.errors import SandboxError, SandboxSetupError

_libc = ctypes.CDLL(None, use_errno=True)  # libc, without find_library's ldconfig run

PR_SET_DUMPABLE = 4
IPC_RMID = 0
SYSVIPC = Path("/proc/sysvipc")
# keyctl(2) has no libc wrapper in glibc; its number differs by architecture.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_SETPERM = 5
KEYCTL_CLEAR = 7
KEYCTL_READ = 11
KEYCTL_GET_PERSISTENT = 22
KEY_SPEC_PROCESS_KEYRING = -2
KEY_SPEC_SESSION_KEYRING = -3
KEY_POS_VIEW_READ = 0x03000000  # possessor may view and read; nobody may write, link or search
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
USER_KEYRINGS = (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING)
CHILD_WAIT_S = 5.0


def make_undumpable() -> None:
    """Nothing of another uid may read this process's /proc files (environ, mem)."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def refuse_dumpable_setuid() -> None:
    """With fs.suid_dumpable = 1 a uid switch makes a process dumpable, so for the instant
    between a forked child's switch and its exec (or make_undumpable) a slot uid could read
    the runner's memory. 0 and 2 keep it root's."""
    with contextlib.suppress(OSError):
        if Path("/proc/sys/fs/suid_dumpable").read_text().strip() == "1":
            raise SandboxSetupError(
                "fs.suid_dumpable is 1: the rlimit backend would expose the runner's memory "
                "to slot uids; set it to 0 (the kernel's default) on the host"
            )


def scrub_environment_block() -> None:
    """Zero this process's initial environment block, the bytes /proc/<pid>/environ shows,
    and hand libc copies of what os.environ holds instead. Every forked child carries that
    block until it execs, and on Fargate it holds the credentials URI."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (stat fields 50, 51)
    for name, value in os.environ.items():
        os.putenv(name, value)  # a fresh copy outside the block, for C code's getenv
    ctypes.memset(start, 0, end - start)


def seal_session_keyring() -> None:
    """Every command inherits the runner's session keyring and, possessing it, could link a
    key into it for the next job to find. The runner joins a new one that nobody may write."""
    if _keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0) > 0:
        _keyctl(KEYCTL_SETPERM, KEY_SPEC_SESSION_KEYRING, KEY_POS_VIEW_READ)


def session_keys() -> int:
    """Keys linked in the runner's session keyring (0 once sealed)."""
    return max(_keyctl(KEYCTL_READ, KEY_SPEC_SESSION_KEYRING, 0, 0), 0) // 4


def _in_child_as(uid: int, work: str) -> int:
    """Fork; in the child switch to uid (and gid = uid, no groups), do `work`, and report its
    answer (0-254) as the exit status. Raises SandboxError when the switch is refused, or when
    the child does not finish within CHILD_WAIT_S."""
    pid = os.fork()
    if pid == 0:  # the child: syscalls only, never returns into the caller's code
        code = 255
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            make_undumpable()
            code = _WORK[work]()
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_WAIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # our own child: no capability needed
            os.waitpid(pid, 0)
            raise SandboxError(f"the clean-up as slot uid {uid} ({work}) did not finish")
        time.sleep(0.001)
    code = os.waitstatus_to_exitcode(status)
    if code == 255:
        raise SandboxError(f"cannot act as slot uid {uid} ({work}): is CAP_SETUID/SETGID kept?")
    return code


def _sysv_objects() -> list[tuple[str, int, int, int]]:
    """Every SysV IPC object: (kind, id, owner uid, creator uid), kind shm, sem or msg."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            lines = (SYSVIPC / kind).read_text().splitlines()
        except OSError:
            continue
        header = lines[0].split()
        id_col = header.index({"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind])
        uid_col, cuid_col = header.index("uid"), header.index("cuid")
        for line in lines[1:]:
            fields = line.split()
            found.append((kind, int(fields[id_col]), int(fields[uid_col]), int(fields[cuid_col])))
    return found


def _sysv_ids(uid: int, objects: list[tuple[str, int, int, int]]) -> dict[str, list[int]]:
    """The objects whose owner or creator is `uid`, by kind."""
    found: dict[str, list[int]] = {}
    for kind, ipc_id, owner, creator in objects:
        if uid in (owner, creator):
            found.setdefault(kind, []).append(ipc_id)
    return found


def _remove_ipc() -> int:
    left = 0
    for kind, ids in _sysv_ids(os.getuid(), _sysv_objects()).items():
        for ipc_id in ids:
            if kind == "shm":
                done = _libc.shmctl(ipc_id, IPC_RMID, None)
            elif kind == "sem":
                done = _libc.semctl(ipc_id, 0, IPC_RMID)
            else:
                done = _libc.msgctl(ipc_id, IPC_RMID, None)
            if done != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EIDRM):
                left += 1
    return min(left, 254)


def _keyctl(*args: int) -> int:
    if SYS_KEYCTL is None:
        return -1
    result: int = _libc.syscall(SYS_KEYCTL, *(ctypes.c_long(a) for a in args))
    return result


def _keyrings() -> list[int]:
    """The uid's keyrings that outlive its processes: user, user-session and, where the
    kernel has them, its persistent keyring (the look-up creates it when missing)."""
    rings = list(USER_KEYRINGS)
    persistent = _keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_PROCESS_KEYRING)
    if persistent > 0:
        rings.append(persistent)
    return rings


def _clear_keyrings() -> int:
    for keyring in _keyrings():
        _keyctl(KEYCTL_CLEAR, keyring)  # refused (seccomp, no keys support): nothing to clear
    return 0


def _count_keys() -> int:
    """Keys linked in the uid's keyrings that outlive its processes."""
    count = 0
    for keyring in _keyrings():
        size = _keyctl(KEYCTL_READ, keyring, 0, 0)  # the payload size: 4 bytes per key id
        if size > 0:
            count += size // 4
    return min(count, 254)


def _clean() -> int:
    """In the child, as the uid: its SysV IPC objects, then its keyrings."""
    return max(_remove_ipc(), _clear_keyrings())


def remove_ipc_and_keys(uids: tuple[int, ...]) -> None:
    """Remove the uids' SysV IPC objects and empty their persistent keyrings: one child per
    uid. (The kernel keeps a uid's keyrings whether or not it used them, so there is no cheap
    way to skip a uid: /proc/key-users lists every uid a long-lived host ever ran.)"""
    for uid in uids:
        _in_child_as(uid, "clean")


def ipc_and_keys_left(uids: tuple[int, ...]) -> list[str]:
    """What `remove_ipc_and_keys` should have left nothing of, in words."""
    found = []
    objects = _sysv_objects()
    for uid in uids:
        for kind, ids in _sysv_ids(uid, objects).items():
            found.append(f"uid {uid}: SysV {kind} {ids}")
        if keys := _in_child_as(uid, "count"):
            found.append(f"uid {uid}: {keys} keys in its user keyrings")
    return found


_WORK = {"clean": _clean, "count": _count_keys}
