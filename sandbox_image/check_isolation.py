"""Which per-job isolation primitives does this container allow? Informational, stdlib only.

An operator runs this inside a Fargate task built from the worker's task definition (see
docs/fargate-isolation.md for the exact commands), once as deployed and once with SYS_PTRACE
added. It prints one JSON object on one line (one CloudWatch log event) and always exits 0.

Every probe is isolated: it reports {"status": "ok" | "denied (errno NAME)" | "absent" |
"error (...)", ...details}. Probes that change process state (namespaces, seccomp, Landlock,
ptrace, setuid) run in a forked child, so this process stays as it started. Nothing here
imports trialbox: the script must run from any Python 3.11 in the image, even passed inline as
`python -c "$(cat check_isolation.py)"`.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

VERSION = 1
NOBODY = 65534
CHILD_TIMEOUT_S = 20

# Syscall numbers that glibc has no wrapper for (or that this script calls raw), per
# architecture. Landlock's are in the shared table (444-446 everywhere); getppid differs and is
# called once through the table to prove the table matches the running kernel.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "getppid": 110,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "getppid": 173,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}
SYSCALLS["amd64"] = SYSCALLS["x86_64"]
SYSCALLS["arm64"] = SYSCALLS["aarch64"]
# seccomp_data.arch values (linux/audit.h) for the SIGSYS filter's architecture check.
AUDIT_ARCH = {"x86_64": 0xC000003E, "amd64": 0xC000003E, "aarch64": 0xC00000B7, "arm64": 0xC00000B7}

CAP_NAMES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_TRAP = 0x00030000
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06
PTRACE_TRACEME = 0
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_FS_WRITE_FILE = 1 << 1
LANDLOCK_ACCESS_FS_MAKE_REG = 1 << 8

Result = dict[str, Any]

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def machine() -> str:
    return platform.machine()


def syscall_nr(name: str) -> int:
    table = SYSCALLS.get(machine())
    if table is None:
        raise LookupError(f"no syscall table for {machine()}")
    return table[name]


def errno_name(number: int) -> str:
    return errno.errorcode.get(number, str(number))


def failed(number: int) -> str:
    """The status for a failed call: ENOSYS means the kernel lacks it, anything else denied."""
    if number == errno.ENOSYS:
        return "absent (errno ENOSYS)"
    return f"denied (errno {errno_name(number)})"


def check(ret: int) -> None:
    """Raise OSError with the C errno when a libc call returned -1."""
    if ret == -1:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def guarded(probe: Callable[[], Result]) -> Result:
    try:
        return probe()
    except FileNotFoundError:
        return {"status": "absent"}
    except OSError as exc:
        return {"status": failed(exc.errno or 0)}
    except Exception as exc:  # informational: report, never stop
        return {"status": f"error ({type(exc).__name__}: {exc})"}


def in_child(probe: Callable[[], Result], timeout_s: float = CHILD_TIMEOUT_S) -> Result:
    """Run `probe` in a forked child and return its result; the parent's state is untouched."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            signal.alarm(int(timeout_s) + 1)
            result = guarded(probe)
            data = json.dumps(result).encode()
            while data:
                data = data[os.write(write_fd, data) :]
        except BaseException:  # the child must always _exit
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s + 5
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if chunks:
        return json.loads(b"".join(chunks))
    if os.WIFSIGNALED(status):
        return {"status": f"error (child killed by {signal.Signals(os.WTERMSIG(status)).name})"}
    return {"status": f"error (child exited {os.waitstatus_to_exitcode(status)} without a result)"}


# --- reading the process's own state -------------------------------------------------------


def status_fields() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def decode_caps(mask: int) -> list[str]:
    return [
        CAP_NAMES[bit] if bit < len(CAP_NAMES) else f"CAP_{bit}"
        for bit in range(64)
        if mask >> bit & 1
    ]


def probe_capabilities() -> Result:
    fields = status_fields()
    result: Result = {"status": "ok"}
    for key, label in (
        ("CapEff", "effective"),
        ("CapBnd", "bounding"),
        ("CapPrm", "permitted"),
        ("CapInh", "inheritable"),
        ("CapAmb", "ambient"),
    ):
        if key in fields:
            result[label] = {"hex": fields[key], "names": decode_caps(int(fields[key], 16))}
    return result


def probe_seccomp() -> Result:
    fields = status_fields()
    if "Seccomp" not in fields:
        return {"status": "absent"}
    mode = int(fields["Seccomp"])
    return {
        "status": "ok",
        "mode": mode,
        "mode_name": {0: "disabled", 1: "strict", 2: "filter"}.get(mode, "unknown"),
        "filters": int(fields.get("Seccomp_filters", "0")),
    }


def probe_no_new_privs() -> Result:
    fields = status_fields()
    if "NoNewPrivs" not in fields:
        return {"status": "absent"}
    return {"status": "ok", "value": int(fields["NoNewPrivs"])}


def read_text(path: str) -> Result:
    with open(path) as handle:
        return {"status": "ok", "value": handle.read().strip()}


def read_int(path: str) -> Result:
    result = read_text(path)
    result["value"] = int(result["value"])
    return result


def probe_kernel() -> Result:
    uname = os.uname()
    result: Result = {"status": "ok", "release": uname.release, "version": uname.version}
    result["machine"] = uname.machine
    return result


def probe_identity() -> Result:
    return {
        "status": "ok",
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }


def probe_syscall_table() -> Result:
    """Prove the table's numbers match this kernel: getppid through its raw number."""
    table = SYSCALLS.get(machine())
    if table is None:
        return {"status": "absent", "machine": machine()}
    got = libc().syscall(ctypes.c_long(table["getppid"]))
    ok = got == os.getppid()
    return {"status": "ok" if ok else "error (getppid mismatch)", "machine": machine()}


def mountinfo() -> list[dict[str, str]]:
    mounts = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            fields = left.split()
            fs_type, _source, *super_opts = right.split()
            mounts.append(
                {
                    "point": fields[4].replace("\\040", " "),
                    "options": fields[5],
                    "type": fs_type,
                    "super": super_opts[0] if super_opts else "",
                }
            )
    return mounts


def probe_mount(point: str) -> Result:
    for mount in reversed(mountinfo()):  # the last mount on a point is the visible one
        if mount["point"] == point:
            return {"status": "ok", "type": mount["type"], "options": mount["options"]}
    return {"status": "absent"}


def probe_root_fs() -> Result:
    result = probe_mount("/")
    if result["status"] == "ok":
        result["read_only"] = "ro" in result["options"].split(",")
    return result


def probe_sysvipc() -> Result:
    if not os.path.isdir("/proc/sysvipc"):
        return {"status": "absent"}
    return {"status": "ok", "entries": sorted(os.listdir("/proc/sysvipc"))}


def probe_lsm() -> Result:
    """The active LSMs (if securityfs is visible) and this process's AppArmor/SELinux label."""
    try:
        result = read_text("/sys/kernel/security/lsm")
    except OSError:
        result = {"status": "absent"}
    for label, path in (
        ("apparmor", "/proc/self/attr/apparmor/current"),
        ("attr_current", "/proc/self/attr/current"),
    ):
        try:
            with open(path) as handle:
                result[label] = handle.read().strip("\x00\n ")
        except OSError as exc:
            absent = exc.errno in (errno.ENOENT, errno.EINVAL)  # EINVAL: no LSM answers
            result[label] = (
                f"absent (errno {errno_name(exc.errno or 0)})" if absent else failed(exc.errno or 0)
            )
    return result


def own_cgroup_path(version: int) -> str:
    """This process's cgroup: the unified line on v2, the memory controller's line on v1."""
    with open("/proc/self/cgroup") as cgroup:
        for line in cgroup.read().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if version == 2 and hierarchy == "0" and controllers == "":
                return path
            if version == 1 and "memory" in controllers.split(","):
                return path
    return "/"


def probe_cgroup() -> Result:
    base = "/sys/fs/cgroup"
    if os.path.exists(os.path.join(base, "cgroup.controllers")):
        version, root = 2, base
    elif os.path.isdir(os.path.join(base, "memory")):
        version, root = 1, os.path.join(base, "memory")
    else:
        return {"status": "absent"}
    mount = probe_mount(base)
    own = own_cgroup_path(version)
    result: Result = {
        "status": "ok",
        "version": version,
        "own": own,
        "mount_options": mount.get("options"),
    }
    # Writable means a child cgroup can be made (and is removed at once).
    probe_dir = os.path.join(root + own.rstrip("/"), f"isolation-check-{os.getpid()}")
    try:
        os.mkdir(probe_dir)
    except OSError as exc:
        result["writable"] = failed(exc.errno or 0)
    else:
        os.rmdir(probe_dir)
        result["writable"] = "ok"
    return result


# --- probes that change state: each runs in its own child ----------------------------------


def write_file(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def unshare(flags: int) -> Result:
    check(libc().unshare(ctypes.c_int(flags)))
    return {"status": "ok"}


def userns_mount_tmpfs() -> Result:
    """A user namespace owning a mount namespace, and a tmpfs in it: what bwrap does. Mapping
    uid 0 (running as root) needs CAP_SETFCAP since Linux 5.12, so root without it fails at
    uid_map where a slot uid succeeds."""
    uid, gid = os.getuid(), os.getgid()
    lib = libc()
    target = tempfile.gettempdir().encode()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("unshare", lambda: check(lib.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS)))),
        ("setgroups", lambda: write_file("/proc/self/setgroups", "deny")),
        ("uid_map", lambda: write_file("/proc/self/uid_map", f"0 {uid} 1")),
        ("gid_map", lambda: write_file("/proc/self/gid_map", f"0 {gid} 1")),
        (
            "make_private",
            lambda: check(
                lib.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None)
            ),
        ),
        (
            "mount_tmpfs",
            lambda: check(lib.mount(b"none", target, b"tmpfs", ctypes.c_ulong(0), b"size=1m")),
        ),
        ("write", lambda: write_file(os.path.join(target.decode(), "probe"), "x")),
    ]
    for step, action in steps:
        try:
            action()
        except OSError as exc:
            return {"status": failed(exc.errno or 0), "step": step}
    return {"status": "ok", "mounted_on": target.decode()}


def ptrace_traceme() -> Result:
    lib = libc()
    lib.ptrace.restype = ctypes.c_long
    ret = lib.ptrace(ctypes.c_long(PTRACE_TRACEME), ctypes.c_long(0), None, None)
    check(ret)
    return {"status": "ok"}


def ptrace_attach() -> Result:
    """Attach to a child of our own (what gVisor's ptrace and systrap platforms do)."""
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(CHILD_TIMEOUT_S)
        finally:
            os._exit(0)
    lib = libc()
    lib.ptrace.restype = ctypes.c_long
    try:
        ret = lib.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None)
        check(ret)
        _, status = os.waitpid(pid, os.WUNTRACED)
        stopped = os.WIFSTOPPED(status)
        lib.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
        return {"status": "ok" if stopped else "error (tracee did not stop)"}
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def install_filter(instructions: list[tuple[int, int, int, int]]) -> None:
    lib = libc()
    check(lib.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0))
    program = (SockFilter * len(instructions))(*(SockFilter(*i) for i in instructions))
    fprog = SockFprog(len(instructions), program)
    check(lib.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0))


def seccomp_allow_all() -> Result:
    """seccomp-bpf under no_new_privs: needs no capability."""
    install_filter([(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)])
    return {"status": "ok", "mode_after": int(status_fields()["Seccomp"])}


def seccomp_trap() -> Result:
    """SECCOMP_RET_TRAP delivers SIGSYS: the mechanism gVisor's systrap platform is built on."""
    arch = AUDIT_ARCH[machine()]
    nr = syscall_nr("getppid")
    trapped: list[int] = []
    signal.signal(signal.SIGSYS, lambda signum, frame: trapped.append(signum))
    install_filter(
        [
            (BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            (BPF_JEQ_K, 0, 3, arch),
            (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
            (BPF_JEQ_K, 0, 1, nr),
            (BPF_RET_K, 0, 0, SECCOMP_RET_TRAP),
            (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        ]
    )
    libc().syscall(ctypes.c_long(nr))
    time.sleep(0)  # let Python run the handler
    return {"status": "ok" if trapped else "error (no SIGSYS)"}


def landlock_abi() -> Result:
    lib = libc()
    lib.syscall.restype = ctypes.c_long
    ret = lib.syscall(
        ctypes.c_long(syscall_nr("landlock_create_ruleset")),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    if ret < 0:
        number = ctypes.get_errno()
        if number == errno.EOPNOTSUPP:  # built in, not enabled at boot
            return {"status": "absent (errno EOPNOTSUPP)", "abi": "absent"}
        status = failed(number)
        return {"status": status, "abi": "absent" if status.startswith("absent") else status}
    return {"status": "ok", "abi": int(ret)}


def landlock_enforce() -> Result:
    """A ruleset that handles file writes and allows none: an existing file can't be written."""
    fd, path = tempfile.mkstemp(prefix="isolation-check-")
    os.close(fd)
    try:
        lib = libc()
        lib.syscall.restype = ctypes.c_long
        handled = ctypes.c_uint64(LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG)
        ruleset = lib.syscall(
            ctypes.c_long(syscall_nr("landlock_create_ruleset")),
            ctypes.byref(handled),
            ctypes.c_size_t(ctypes.sizeof(handled)),
            ctypes.c_uint32(0),
        )
        check(ruleset)
        check(lib.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0))
        restrict = syscall_nr("landlock_restrict_self")
        check(lib.syscall(ctypes.c_long(restrict), ctypes.c_int(ruleset), ctypes.c_uint32(0)))
        try:
            with open(path, "w"):
                pass
        except PermissionError:
            return {"status": "ok"}
        return {"status": "error (write allowed under the ruleset)"}
    finally:
        os.unlink(path)


def bwrap() -> Result:
    binary = shutil.which("bwrap")
    if binary is None:
        return {"status": "absent"}
    argv = [binary, "--unshare-all", "--ro-bind", "/", "/", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if done.returncode == 0:
        return {"status": "ok", "argv": argv}
    tail = done.stderr.strip()[-300:]
    return {"status": f"denied (exit {done.returncode})", "argv": argv, "stderr": tail}


STATEFUL: dict[str, Callable[[], Result]] = {
    "unshare_user": lambda: unshare(CLONE_NEWUSER),
    "unshare_mount": lambda: unshare(CLONE_NEWNS),
    "unshare_pid_net_ipc_uts": lambda: unshare(
        CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    ),
    "userns_mount_tmpfs": userns_mount_tmpfs,
    "bwrap": bwrap,
    "ptrace_traceme": ptrace_traceme,
    "ptrace_attach_child": ptrace_attach,
    "seccomp_filter_no_new_privs": seccomp_allow_all,
    "seccomp_trap_sigsys": seccomp_trap,
    "landlock": landlock_abi,
    "landlock_enforce": landlock_enforce,
}
# What an unprivileged slot uid can do: the same probes, after dropping to NOBODY.
AS_SLOT_UID = (
    "unshare_user",
    "userns_mount_tmpfs",
    "bwrap",
    "ptrace_attach_child",
    "seccomp_filter_no_new_privs",
    "seccomp_trap_sigsys",
    "landlock_enforce",
)


def as_unprivileged() -> Result:
    """Drop to NOBODY (no groups, no capabilities left) and run the stateful probes there."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    # A uid change clears "dumpable", which setpriv's exec would restore; without it the
    # kernel refuses ptrace and /proc/self writes for reasons the slot uid would not meet.
    check(libc().prctl(PR_SET_DUMPABLE, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0))
    os.chdir("/")
    result: Result = {"status": "ok", "uid": os.getuid()}
    result["capabilities"] = probe_capabilities()
    for name in AS_SLOT_UID:
        result[name] = in_child(STATEFUL[name])
    return result


def probe_unprivileged() -> Result:
    if os.geteuid() != 0:
        return {"status": "absent (not root: the probes above already ran unprivileged)"}
    return in_child(as_unprivileged, timeout_s=CHILD_TIMEOUT_S * (len(AS_SLOT_UID) + 1))


def collect() -> Result:
    report: Result = {"check_isolation": VERSION}
    plain: dict[str, Callable[[], Result]] = {
        "kernel": probe_kernel,
        "identity": probe_identity,
        "syscall_table": probe_syscall_table,
        "capabilities": probe_capabilities,
        "seccomp": probe_seccomp,
        "no_new_privs": probe_no_new_privs,
        "lsm": probe_lsm,
        "max_user_namespaces": lambda: read_int("/proc/sys/user/max_user_namespaces"),
        "unprivileged_userns_clone": lambda: read_int("/proc/sys/kernel/unprivileged_userns_clone"),
        "ptrace_scope": lambda: read_int("/proc/sys/kernel/yama/ptrace_scope"),
        # The rlimit backend refuses 1: a uid switch would make the runner's children dumpable.
        "suid_dumpable": lambda: read_int("/proc/sys/fs/suid_dumpable"),
        "root_fs": probe_root_fs,
        "cgroup": probe_cgroup,
        "dev_mqueue": lambda: probe_mount("/dev/mqueue"),
        "dev_shm": lambda: probe_mount("/dev/shm"),
        "keys_maxkeys": lambda: read_int("/proc/sys/kernel/keys/maxkeys"),
        "sysvipc": probe_sysvipc,
    }
    for name, probe in plain.items():
        report[name] = guarded(probe)
    for name, probe in STATEFUL.items():
        report[name] = in_child(probe)
    report["as_slot_uid"] = guarded(probe_unprivileged)
    return report


def main() -> int:
    try:
        report = collect()
    except Exception as exc:  # informational: print, exit 0
        report = {"check_isolation": VERSION, "status": f"error ({type(exc).__name__}: {exc})"}
    sys.stdout.write(json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
