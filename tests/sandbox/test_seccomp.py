"""The seccomp filter on both backends: no network socket (loopback included), no keyring,
no other ABI; AF_UNIX socketpairs (asyncio, multiprocessing) still work."""

from __future__ import annotations

import pytest

from trialbox.models import Limits
from trialbox.sandbox import seccomp
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner

PROBE = r"""
import asyncio, ctypes, errno, platform, socket
out = []
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_PACKET):
    try:
        socket.socket(family, socket.SOCK_STREAM if family != socket.AF_PACKET else socket.SOCK_RAW)
        out.append(f"socket {family.name} opened")
    except OSError as e:
        out.append(f"socket {family.name} {errno.errorcode[e.errno]}")
a, b = socket.socketpair()
a.sendall(b"ok")
out.append("socketpair " + b.recv(2).decode())
out.append("asyncio " + asyncio.run(asyncio.sleep(0, result="ok")))
libc = ctypes.CDLL(None, use_errno=True)
add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
r = libc.syscall(add_key, b"user", b"k", b"v", 1, -3)
out.append("add_key " + ("ok" if r > 0 else errno.errorcode[ctypes.get_errno()]))
print("; ".join(out))
"""
EXPECTED = (
    "socket AF_INET EAFNOSUPPORT; socket AF_INET6 EAFNOSUPPORT; socket AF_PACKET EAFNOSUPPORT; "
    "socketpair ok; asyncio ok; add_key EPERM"
)


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def backend(request: pytest.FixtureRequest) -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": request.param}))


def test_network_sockets_and_keyrings_are_denied(backend: Runner) -> None:
    result = backend.exec(["python", "-c", PROBE], Limits())
    assert result.stdout.strip() == EXPECTED, result.stderr


def test_the_program_is_one_filter_per_architecture() -> None:
    for machine in seccomp.ARCHES:
        program = seccomp.program(machine)
        assert len(program) % 8 == 0 and len(program) // 8 == 25


NAMESPACES = r"""
import ctypes, errno, os, platform, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
out = []
# CLONE_NEWUSER, and a user namespace's own mount namespace (a private tmpfs no watchdog sees)
for name, flags in (("user", 0x10000000), ("user+mount", 0x10020000)):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(flags) == 0 else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out.append(f"unshare {name} " + ("ok" if code == 0 else errno.errorcode.get(code, str(code))))
clone, clone3, setns = {"x86_64": (56, 435, 308), "aarch64": (220, 435, 268)}[platform.machine()]
r = libc.syscall(clone, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
if r == 0:
    os._exit(0)
out.append("clone user " + ("ok" if r > 0 else errno.errorcode[ctypes.get_errno()]))
r = libc.syscall(setns, 0, 0)
out.append("setns " + errno.errorcode[ctypes.get_errno()])
seen = []
thread = threading.Thread(target=seen.append, args=("ok",))
thread.start(); thread.join()
out.append("thread " + seen[0])
echoed = subprocess.run(["echo", "ok"], capture_output=True, text=True)
out.append("subprocess " + echoed.stdout.strip())
print("; ".join(out))
"""


def test_no_namespace_can_be_made_or_joined(backend: Runner) -> None:
    """Was a break (red team 24, W2): on the rlimit backend a sandbox made a user namespace
    and a mount namespace in it, and held 512 MiB in a private tmpfs the watchdog's mount list
    never shows (`succeeded`, peak 54 MiB, under 256 MiB). No sandboxed code needs a namespace
    of its own: clone and unshare with a namespace flag are denied (EPERM), setns too, and
    clone3, whose flags are behind a pointer, answers ENOSYS (glibc then uses clone). Threads
    and subprocesses still work."""
    result = backend.exec(["python", "-c", NAMESPACES], Limits())
    assert result.stdout.strip() == (
        "unshare user EPERM; unshare user+mount EPERM; clone user EPERM; setns EPERM; "
        "thread ok; subprocess ok"
    ), result.stderr
