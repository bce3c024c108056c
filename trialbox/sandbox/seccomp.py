"""A seccomp filter for every sandboxed command: what sandboxed code never needs and could use
to hold kernel resources outside its limits is denied with an errno, never a kill.

- Sockets of any family but AF_UNIX (the socketpair asyncio and multiprocessing use): no
  TCP/UDP, loopback included, whose buffers are kernel memory no memory cgroup charges, and no
  netlink, whose receive queues a process fills with the kernel's own replies (900
  NETLINK_ROUTE sockets held 1.1 GiB) and which no per-uid interface shows (EAFNOSUPPORT).
  glibc's interface queries (getaddrinfo's AI_ADDRCONFIG) assume both IP families when
  netlink is refused; the sandbox has no network to ask about anyway.
- SysV semaphore arrays of more than SEMMSL semaphores (EINVAL, the kernel's answer past its
  own limit): one semget of 32000 is 2 MiB of kernel memory. The arrays a sandbox holds
  count as its memory on the rlimit backend (kernel_memory); the cap keeps what one call can
  add between two samples small.
- The kernel keyrings (`add_key`, `request_key`, `keyctl`): keys outlive the process and would
  linger into the next job on the slot (EPERM).
- Every system call of another ABI (i386 `int 0x80`, x32): the filter reads the native table
  only (ENOSYS).

The program is classic BPF, built here (no libseccomp in the image): bwrap loads it with
`--seccomp FD`; the rlimit backend installs it in the child before exec (`install`).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JGT_K = 0x25
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
AF_UNIX = 1
# The kernel's historical SEMMSL: what portable programs assume an array may hold.
SEMMSL = 250
X32_BIT = 0x40000000

# machine: (audit arch, socket, semget, add_key, request_key, keyctl)
ARCHES = {
    "x86_64": (0xC000003E, 41, 64, 248, 249, 250),
    "aarch64": (0xC00000B7, 198, 190, 217, 218, 219),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter as an array of `struct sock_filter`."""
    arch, socket_nr, semget_nr, *keyring = ARCHES[machine or platform.machine()]
    deny_abi = RET_ERRNO | errno.ENOSYS
    deny_keys = RET_ERRNO | errno.EPERM
    deny_family = RET_ERRNO | errno.EAFNOSUPPORT
    deny_size = RET_ERRNO | errno.EINVAL
    body = [
        _insn(LD_W_ABS, 0, 0, 4),  # 0: arch
        _insn(JEQ_K, 1, 0, arch),  # 1: native -> 3
        _insn(RET_K, 0, 0, deny_abi),  # 2
        _insn(LD_W_ABS, 0, 0, 0),  # 3: nr
        _insn(JGE_K, 0, 1, X32_BIT),  # 4: x32 -> 5, else 6
        _insn(RET_K, 0, 0, deny_abi),  # 5
        _insn(JEQ_K, 5, 0, socket_nr),  # 6: socket -> 12
        _insn(JEQ_K, 6, 0, semget_nr),  # 7: semget -> 14
        _insn(JEQ_K, 2, 0, keyring[0]),  # 8: add_key -> 11
        _insn(JEQ_K, 1, 0, keyring[1]),  # 9: request_key -> 11
        _insn(JEQ_K, 0, 6, keyring[2]),  # 10: keyctl -> 11, else 17
        _insn(RET_K, 0, 0, deny_keys),  # 11
        _insn(LD_W_ABS, 0, 0, 16),  # 12: args[0], the family (low 32 bits)
        _insn(JEQ_K, 3, 2, AF_UNIX),  # 13: -> 17, else 16
        _insn(LD_W_ABS, 0, 0, 24),  # 14: args[1], nsems (low 32 bits: a negative is large)
        _insn(JGT_K, 2, 1, SEMMSL),  # 15: -> 18, else 17
        _insn(RET_K, 0, 0, deny_family),  # 16
        _insn(RET_K, 0, 0, RET_ALLOW),  # 17
        _insn(RET_K, 0, 0, deny_size),  # 18
    ]
    return b"".join(body)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
_PROGRAM = program() if platform.machine() in ARCHES else b""
_BUFFER = ctypes.create_string_buffer(_PROGRAM, len(_PROGRAM) or 1)
_FPROG = _SockFprog(len(_PROGRAM) // 8, ctypes.cast(_BUFFER, ctypes.c_void_p))
_LIBC = ctypes.CDLL(None, use_errno=True)


def install() -> None:
    """In a forked child before exec (subprocess's preexec_fn, which runs after the uid switch):
    built at import, so nothing here allocates. no_new_privs first, as seccomp requires of an
    unprivileged caller (the command gets it from setpriv anyway)."""
    if not _PROGRAM:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {platform.machine()}")
    if (
        _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        or _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_FPROG), 0, 0) != 0
    ):
        code = ctypes.get_errno()
        raise OSError(code, f"seccomp: {errno.errorcode.get(code, code)}")
