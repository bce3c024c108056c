"""The container runtime's part (what runc does on Fargate), run by the host's Python inside
`unshare --mount --pid --ipc --uts --fork` under the host's tini as pid 1:

  python nsinit.py SPEC.json

It mounts the image's layers as an overlay root, gives it /proc, a minimal /dev (null, zero,
full, random, urandom, tty; devpts; /dev/shm a tmpfs; /dev/mqueue), /sys read-only, Docker's
masked and read-only /proc paths, the declared volumes, then makes the root read-only when
the task says so, pivots into it, joins a fresh session keyring (as runc does), limits the
capability bounding set, switches user, and execs the entrypoint with exactly the given
environment. Nothing of the host's filesystem stays reachable. Every mount lives in the
private mount namespace, so all of it goes when the namespace's last process exits.

Standalone on purpose (stdlib only): it runs before any image content exists.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
KEYCTL_JOIN_SESSION_KEYRING = 1
SYSCALLS = {
    "x86_64": {"pivot_root": 155, "keyctl": 250},
    "aarch64": {"pivot_root": 41, "keyctl": 219},
}
CAPS = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
]  # fmt: skip
# Docker's defaults (moby oci/defaults.go), which Fargate applies too.
MASKED = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
]  # fmt: skip
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
DEVICES = ["null", "zero", "full", "random", "urandom", "tty"]


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str = "") -> None:
    check(
        libc.mount(
            source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )  # fmt: skip


def bind(source: str, target: str, readonly: bool = False, flags: int = 0) -> None:
    mount(source, target, None, MS_BIND | flags)
    if readonly:
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def ensure(path: str, directory: bool) -> None:
    """A mount point, made in the container's writable layer (as runc does before the root
    becomes read-only)."""
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if directory:
        os.mkdir(path)
    else:
        open(path, "w").close()


def overlay(lower: list[str], upper: str | None, work: str | None, target: str) -> None:
    # Each layer is a directory of its own, so the option string stays short enough.
    options = "lowerdir=" + ":".join(lower)
    if upper and work:
        options += f",upperdir={upper},workdir={work}"
    mount("overlay", target, "overlay", 0, options)


def make_dev(root: str) -> None:
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=65536k")
    for name in DEVICES:
        ensure(f"{dev}/{name}", directory=False)
        bind(f"/dev/{name}", f"{dev}/{name}")
    for name, target in {
        "fd": "/proc/self/fd",
        "stdin": "/proc/self/fd/0",
        "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2",
        "ptmx": "pts/ptmx",
        "core": "/proc/kcore",
    }.items():
        os.symlink(target, f"{dev}/{name}")
    for name in ("pts", "shm", "mqueue"):
        os.mkdir(f"{dev}/{name}")
    pts = "newinstance,ptmxmode=0666,mode=0620,gid=5"
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts)
    mount("shm", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=65536k")
    # The mqueue instance of the new IPC namespace (the caller unshared it).
    mount("mqueue", f"{dev}/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def mask(root: str) -> None:
    for path in MASKED:
        target = root + path
        if os.path.isdir(target):
            mount("tmpfs", target, "tmpfs", MS_RDONLY)
        elif os.path.exists(target):
            bind("/dev/null", target)
    for path in READONLY:
        target = root + path
        if os.path.exists(target):
            bind(target, target, readonly=True, flags=MS_REC)


def pivot(root: str) -> None:
    """pivot_root(".", ".") then detach the old root: runc's way, no put_old directory."""
    os.chdir(root)
    number = SYSCALLS[platform.machine()]["pivot_root"]
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def limit_capabilities(keep: list[str]) -> None:
    last = int(read("/proc/sys/kernel/cap_last_cap"))
    unknown = set(keep) - set(CAPS)
    if unknown:
        raise ValueError(f"unknown capabilities: {sorted(unknown)}")
    for number in range(last + 1):
        name = CAPS[number] if number < len(CAPS) else f"CAP_{number}"
        if name not in keep:
            check(libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0), f"drop {name}")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    status = read("/proc/self/status")
    inheritable = next(line for line in status.splitlines() if line.startswith("CapInh:"))
    if int(inheritable.split()[1], 16) != 0:  # runc leaves it empty; so must we
        raise RuntimeError(f"the harness itself has inheritable capabilities: {inheritable}")


def switch_user(user: str | None) -> None:
    if not user:
        return  # root, as the image and the task definition leave it
    name, _, group = user.partition(":")
    uid = int(name) if name.isdigit() else next(
        int(line.split(":")[2])
        for line in read("/etc/passwd").splitlines()
        if line.split(":")[0] == name
    )  # fmt: skip
    gid = int(group) if group.isdigit() else uid
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def container(spec: dict) -> None:  # type: ignore[type-arg]
    scratch = spec["scratch"]
    root = f"{scratch}/root"
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    # The container's own writable layer (only mount points land there before it goes ro).
    mount("tmpfs", scratch, "tmpfs", 0, "mode=700")
    for name in ("upper", "work", "root"):
        os.mkdir(f"{scratch}/{name}")
    overlay(spec["lower"], f"{scratch}/upper", f"{scratch}/work", root)
    for path in ("/proc", "/dev", "/sys", *[v["path"] for v in spec["volumes"]]):
        ensure(root + path, directory=True)
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(root)
    mount("sysfs", f"{root}/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for volume in spec["volumes"]:
        bind(volume["source"], root + volume["path"], readonly=volume["readonly"])
    for path, content in spec["etc"].items():  # resolv.conf, hosts, hostname: runc binds them
        source = f"{scratch}/{os.path.basename(path)}"
        with open(source, "w") as handle:
            handle.write(content)
        ensure(root + path, directory=False)
        bind(source, root + path)
    mask(root)
    if spec["readonly_root"]:
        mount("none", root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    socket.sethostname(spec["hostname"])
    pivot(root)
    keyctl = SYSCALLS[platform.machine()]["keyctl"]
    if libc.syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "join a new session keyring")
    limit_capabilities(spec["capabilities"])
    switch_user(spec["user"])
    os.chdir(spec["workdir"])
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def build(spec: dict) -> None:  # type: ignore[type-arg]
    """One RUN step: the layers below read-only, this step's changes in `upper`."""
    merged = spec["merged"]
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    overlay(spec["lower"], spec["upper"], spec["work"], merged)
    mount("proc", f"{merged}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(merged)
    if os.path.exists(f"{merged}/etc/resolv.conf"):  # the build reaches the package mirrors
        bind("/etc/resolv.conf", f"{merged}/etc/resolv.conf", readonly=True)
    # Build secrets, as BuildKit's `RUN --mount=type=secret` gives them: on a tmpfs under /run,
    # never in the layer (this machine's CA bundle, for a TLS-intercepting egress proxy).
    mount("tmpfs", f"{merged}/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    os.mkdir(f"{merged}/run/secrets", 0o700)
    for name, source in spec["secrets"].items():
        ensure(f"{merged}/run/secrets/{name}", directory=False)
        bind(source, f"{merged}/run/secrets/{name}", readonly=True)
    os.chroot(merged)
    os.chdir(spec["workdir"])
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    try:
        {"container": container, "build": build}[spec["mode"]](spec)
    except BaseException as exc:  # the harness reads this from the container's log
        print(f"nsinit: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main()
