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
        assert len(program) % 8 == 0 and len(program) // 8 == 19
