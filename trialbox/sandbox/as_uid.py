"""Clean-up done *as* a slot uid, by syscalls in a forked child that never execs.

Why as the uid: `kill(-1)` from the uid reaches every process of that uid in one atomic pass
(a fork bomb cannot outrun it), and only an object's owner may remove its SysV IPC objects or
clear its keyrings without CAP_SYS_ADMIN, which a Fargate task never has. So the worker needs
no CAP_KILL and no CAP_SYS_ADMIN for it.

Why a fork and no exec: an exec'd helper (the `kill` binary, say) running as the slot uid would
be readable by the uid's leftover processes, environment included: on Fargate that holds the
task's credentials URI. A forked child inherits the runner's PR_SET_DUMPABLE=0 and sets it again
after the uid switch, so its /proc files stay root's; it runs for microseconds and only makes
syscalls.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
import signal
import time
from pathlib import Path

from trialbox.errors import SandboxError, SandboxSetupError

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

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
WAIT_GONE_S = 5.0


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
    answer (0-255) as the exit status. Raises SandboxError when the switch is refused."""
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
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 255:
        raise SandboxError(f"cannot act as slot uid {uid} ({work}): is CAP_SETUID/SETGID kept?")
    return code


def _kill_all() -> int:
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    return 0


def _sysv_ids(uid: int) -> dict[str, list[int]]:
    """SysV IPC objects whose owner or creator is `uid`, by kind (shm, sem, msg)."""
    found: dict[str, list[int]] = {}
    for kind in ("shm", "sem", "msg"):
        try:
            lines = (SYSVIPC / kind).read_text().splitlines()
        except OSError:
            continue
        header = lines[0].split()
        uid_cols = [header.index(name) for name in ("uid", "cuid")]
        id_col = header.index({"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind])
        for line in lines[1:]:
            fields = line.split()
            if any(int(fields[col]) == uid for col in uid_cols):
                found.setdefault(kind, []).append(int(fields[id_col]))
    return found


def _remove_ipc() -> int:
    left = 0
    for kind, ids in _sysv_ids(os.getuid()).items():
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
    kernel has them, its persistent keyring (looked up, which creates it, only when the uid
    holds more keys than the first two)."""
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


_WORK = {"kill": _kill_all, "ipc": _remove_ipc, "keys": _clear_keyrings, "count": _count_keys}


def processes_of(uids: tuple[int, ...]) -> list[int]:
    """Live pids owned by one of `uids`. Zombies are dead already and are skipped: their
    reaping is up to their parent (the container's init, or bwrap's)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.stat(entry.path).st_uid not in uids:
                continue
            with open(f"{entry.path}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
            if state not in (b"Z", b"X"):
                found.append(int(entry.name))
    return found


def kill_all(uids: tuple[int, ...]) -> None:
    """SIGKILL every process of each uid, and wait until they are gone."""
    deadline = time.monotonic() + WAIT_GONE_S
    while True:
        for uid in uids:
            _in_child_as(uid, "kill")
        if not processes_of(uids):
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes of slot uids {uids} survived SIGKILL")
        time.sleep(0.005)


def _key_users() -> dict[int, int]:
    """Keys the kernel holds per uid (/proc/key-users' nkeys), for the uids it lists."""
    try:
        lines = Path("/proc/key-users").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        uid, _, rest = line.partition(":")
        found[int(uid)] = int(rest.split()[1].split("/")[0])
    return found


def _may_hold_keys(uid: int, key_users: dict[int, int]) -> bool:
    """More keys than its user and user-session keyrings themselves."""
    return key_users.get(uid, 0) > len(USER_KEYRINGS)


def remove_ipc_and_keys(uids: tuple[int, ...]) -> None:
    """Remove the uids' SysV IPC objects and empty their persistent keyrings."""
    key_users = _key_users()
    for uid in uids:
        if _sysv_ids(uid):
            _in_child_as(uid, "ipc")
        if _may_hold_keys(uid, key_users):
            _in_child_as(uid, "keys")


def ipc_and_keys_left(uids: tuple[int, ...]) -> list[str]:
    """What `remove_ipc_and_keys` should have left nothing of, in words."""
    found = []
    key_users = _key_users()
    for uid in uids:
        for kind, ids in _sysv_ids(uid).items():
            found.append(f"uid {uid}: SysV {kind} {ids}")
        keys = _in_child_as(uid, "count") if _may_hold_keys(uid, key_users) else 0
        if keys:
            found.append(f"uid {uid}: {keys} keys in its user keyrings")
    return found
