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
- Namespaces: `clone` and `unshare` with a namespace flag, and `setns` (EPERM); `clone3`,
  whose flags sit behind a pointer the filter cannot read, answers ENOSYS, and glibc falls back
  to `clone` for threads and processes. A user namespace's own mount namespace holds a tmpfs
  no mount list outside shows: 512 MiB under a 256 MiB limit on the rlimit backend, unseen
  by its watchdog (bwrap's sandbox already has no user namespace left to make: ENOSPC).
- Every system call of another ABI (i386 `int 0x80`, x32): the filter reads the native table
  only (ENOSYS).

The program is classic BPF, built here (no libseccomp in the image): bwrap loads it with
`--seccomp FD`; the rlimit backend's reaper installs it in the command's first process before exec
(trialbox/sandbox/reaper_process.py).
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JGT_K = 0x25
JSET_K = 0x45
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
AF_UNIX = 1
# The kernel's historical SEMMSL: what portable programs assume an array may hold.
SEMMSL = 250
X32_BIT = 0x40000000

# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (not NEWTIME, 0x80: in
# clone's flags that bit is part of the exit signal).
NAMESPACE_FLAGS = 0x7E020000

# machine: (audit arch, socket, semget, add_key, request_key, keyctl, clone, unshare, setns,
# clone3)
ARCHES = {
    "x86_64": (0xC000003E, 41, 64, 248, 249, 250, 56, 272, 308, 435),
    "aarch64": (0xC00000B7, 198, 190, 217, 218, 219, 220, 97, 268, 435),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter as an array of `struct sock_filter`."""
    arch, socket_nr, semget_nr, *keyring, clone_nr, unshare_nr, setns_nr, clone3_nr = ARCHES[
        machine or platform.machine()
    ]
    deny_abi = RET_ERRNO | errno.ENOSYS
    deny_keys = RET_ERRNO | errno.EPERM
    deny_family = RET_ERRNO | errno.EAFNOSUPPORT
    deny_size = RET_ERRNO | errno.EINVAL
    # (opcode, jump if true, jump if false, k): a jump names the label it goes to.
    body: list[tuple[int, str | None, str | None, int] | str] = [
        (LD_W_ABS, None, None, 4),  # arch
        (JEQ_K, "native", None, arch),
        (RET_K, None, None, deny_abi),
        "native",
        (LD_W_ABS, None, None, 0),  # nr
        (JGE_K, "other_abi", None, X32_BIT),
        (JEQ_K, "socket", None, socket_nr),
        (JEQ_K, "semget", None, semget_nr),
        (JEQ_K, "keys", None, keyring[0]),
        (JEQ_K, "keys", None, keyring[1]),
        (JEQ_K, "keys", None, keyring[2]),
        (JEQ_K, "flags", None, clone_nr),
        (JEQ_K, "flags", None, unshare_nr),
        (JEQ_K, "deny", None, setns_nr),
        (JEQ_K, "other_abi", "allow", clone3_nr),
        "flags",
        (LD_W_ABS, None, None, 16),  # args[0], the flags (low 32 bits)
        (JSET_K, "deny", "allow", NAMESPACE_FLAGS),
        "socket",
        (LD_W_ABS, None, None, 16),  # args[0], the family (low 32 bits)
        (JEQ_K, "allow", "deny_family", AF_UNIX),
        "semget",
        (LD_W_ABS, None, None, 24),  # args[1], nsems (low 32 bits: a negative is large)
        (JGT_K, "deny_size", "allow", SEMMSL),
        "other_abi",
        (RET_K, None, None, deny_abi),
        "keys",
        "deny",
        (RET_K, None, None, deny_keys),
        "deny_family",
        (RET_K, None, None, deny_family),
        "deny_size",
        (RET_K, None, None, deny_size),
        "allow",
        (RET_K, None, None, RET_ALLOW),
    ]
    return _assemble(body)


def _assemble(body: list[tuple[int, str | None, str | None, int] | str]) -> bytes:
    """Classic BPF from instructions whose jumps name labels (a jump is relative to the next
    instruction, and only forward)."""
    labels: dict[str, int] = {}
    count = 0
    for item in body:
        if isinstance(item, str):
            labels[item] = count  # the index of the instruction that follows it
        else:
            count += 1
    code: list[bytes] = []
    for item in body:
        if isinstance(item, str):
            continue
        op, if_true, if_false, k = item
        here = len(code) + 1

        def offset(label: str | None, here: int = here) -> int:
            return 0 if label is None else labels[label] - here

        code.append(_insn(op, offset(if_true), offset(if_false), k))
    return b"".join(code)
