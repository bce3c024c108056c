"""The rlimit backend's memory bound for a whole sandbox, where no cgroup can be had (Fargate).

RLIMIT_AS caps each process, not their sum: six processes of a 256 MiB sandbox held 1,236 MiB.
A thread of the runner samples every slot uid's memory (the more often the closer it is to
the limit: see ALLOC_RATE) and, once the sum passes the sandbox's memory_mb, SIGKILLs every
process of the slot (from root, see processes) and reports `oom`, as bwrap's cgroup does.
Only the kernel's own figures are read (never a line a process can write, such as the name
that opens /proc/<pid>/status), a figure that is not a count is an error, and a sample that
fails counts as over the limit: a sampling thread never stops watching.

What a sample counts, over-counting rather than missing:
- each process's resident anonymous and shared-memory pages (RssAnon + RssShmem, kernel
  counters: O(1) to read; a live thread's when the group's leader exited), so a mapped SysV
  segment, tmpfs file, memfd or MAP_SHARED region counts in every process that touched it,
  and so do the copy-on-write pages forked processes share. Only when that sum is over the
  limit, the sample counts each page once instead (Pss_Anon + Pss_Shmem of smaps_rollup,
  which walks the page tables): twenty forks of a 60 MiB parent hold 60 MiB, as bwrap's cgroup
  charges them, not 1.2 GiB; and a child that shares its parent's address space (vfork before
  exec: `subprocess.run`), which the kernel's kcmp shows, counts nothing of its own;
- the uids' SysV segments no process maps (their `rss` in /proc/sysvipc/shm);
- kernel memory queued in the AF_UNIX sockets they own (socket_memory: sock_diag), and
  held in their SysV semaphore arrays and message queues (kernel_memory);
- shared memory no process maps: entries the uids own on the container's tmpfs mounts (a
  file's pages, a long link target's page, and each entry's inode, ENTRY_BYTES) and
  memfds or unlinked tmpfs files a process of theirs holds open, in each of its threads'
  tables of descriptors (unshare(CLONE_FILES) makes one of a thread's own; looked at with
  this thread's fsuid switched to the process's uid: no CAP_SYS_PTRACE on Fargate). Walking
  those costs more, so a sample does it only when the sandbox could be over with the last
  walk's files and all that the machine's Shmem and slab (/proc/meminfo) rose by since as its
  own: nothing else can hide unmapped shared memory. Rises only, between two samples, never
  netted against what others freed meanwhile: a neighbour freeing 300 MiB while the sandbox
  wrote hid the sandbox's own growth from a low-water mark (what it writes while a neighbour
  frees as much between the same two samples only waits for the next walk, which finds it
  all). Its cost is the sandbox's to raise (8,000 files in a place it writes), so it looks
  at files only in directories the uids may write, and the next walk waits WALK_IDLE times
  the last one's CPU time: a fifth of a CPU at most. The last walk's result stands in until
  the next. While a walk must wait, all the machine's Shmem and slab rose by since the last
  one began counts too (both threads count it): however slow the sandbox makes its walks,
  growth between two is never unseen. Walks that keep up with the samples are charged
  nothing of the kind: what grows between two is the sampling's gap, as any memory's (a
  neighbour's burst into /dev/shm, charged that way, ended honest sandboxes `oom`).
  A process that made itself undumpable, whose descriptors cannot be looked at, is charged
  all that the machine's Shmem rose by since the sandbox started instead. A thread that has
  no memory any more (exiting, a zombie, a leader that exited alone) shows its descriptors
  as root's too, and is not taken for one: an honest program's exited child was, and the
  sandbox was charged a neighbour's /dev/shm file.

Not counted: pipe buffers (the kernel caps a uid's at fs.pipe-user-pages-soft, 64 MiB, then
8 KiB a pipe), and kernel memory of other kinds a process can hold (page tables, which
RLIMIT_AS bounds, inotify watches, epoll items).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trialbox.errors import SandboxError
from trialbox.sandbox import kernel_memory, processes
from trialbox.sandbox.socket_memory import UnixSocketMemory

log = logging.getLogger("trialbox.sandbox")

# A sample costs ~0.5 ms of CPU. The next one comes when the sandbox could have filled what is
# left of its limit at ALLOC_RATE a CPU, every SAMPLE_S at the closest and IDLE_S at the
# farthest. The fastest way to fill memory is write() into a memfd or a tmpfs file: six
# processes on two cores here filled 550 MiB in 50 ms (~5.5 GiB/s a core; page faults of the
# heap are slower, ~0.5 GiB/s a core on Firecracker, as Fargate is).
SAMPLE_S = 0.002
IDLE_S = 0.05
# A walk of the tmpfs files costs what the sandbox put there: WALK_IDLE times its CPU time
# passes before the next one, so the walks take at most a fifth of a CPU.
WALK_IDLE = 4
ALLOC_RATE = 8 * 1024**3
KiB = 1024
# An entry of a tmpfs holds an inode and a dentry (slab) besides its pages: an empty file or
# a directory is ~1 KiB of memory.
ENTRY_BYTES = 1024
MOUNTINFO = Path("/proc/self/mountinfo")
SHM_FS = ("tmpfs", "shm")


def tmpfs_places(mountinfo: str) -> list[Path]:
    """Writable tmpfs mount points, from /proc/self/mountinfo text: where a file is memory."""
    places = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[0] == "tmpfs" and "rw" in fields[5].split(","):
            places.append(Path(fields[4].encode().decode("unicode_escape")))
    return places


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 8192)
    finally:
        os.close(fd)


def _pids(uids: tuple[int, ...]) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid in uids:
                    found.append(int(entry.name))
    return found


def _fields(text: bytes, keys: tuple[bytes, ...]) -> dict[bytes, int]:
    """The kernel's own `Key:  value kB` lines of a /proc status or smaps_rollup text, by key.
    The first line is never read: a status's is the name a process gives itself (its comm,
    where the kernel escapes a newline), and `RssAnon:0` there is no figure. A value that is
    not a count is a ValueError, never a negative or a guess."""
    found = {}
    for line in text.split(b"\n")[1:]:
        key, colon, value = line.partition(b":")
        if colon and key + colon in keys:
            figure = value.split()[:1]
            if not figure or not figure[0].isdigit():
                raise ValueError(f"not a count in a /proc line: {line[:80]!r}")
            found[key + colon] = int(figure[0])
    return found


def _rss_fields(status: bytes) -> int | None:
    found = _fields(status, (b"RssAnon:", b"RssShmem:"))
    if b"RssAnon:" not in found:
        return None  # no memory of its own to show: a zombie, or a leader that exited alone
    return sum(found.values()) * KiB


def _resident(pid: int) -> int:
    """Resident anonymous + shared-memory bytes of one thread group (0 once it is gone). A
    leader that exited alone shows none while its other threads run on with the group's
    memory: then any live thread's status has it."""
    with contextlib.suppress(OSError):
        found = _rss_fields(_read(f"/proc/{pid}/status"))
        if found is not None:
            return found
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found = _rss_fields(_read(f"/proc/{pid}/task/{tid}/status"))
                if found is not None:
                    return found
    return 0


def _pss_fields(rollup: bytes) -> int | None:
    found = _fields(rollup, (b"Pss_Anon:", b"Pss_Shmem:"))
    if b"Pss_Anon:" not in found:
        return None  # no memory to show (a leader that exited alone), or an old kernel
    return sum(found.values()) * KiB


def _proportional(pid: int) -> int:
    """What one thread group really holds of anonymous and shared memory: each page divided by
    the processes that map it (Pss), so copy-on-write pages a fork shares count once over the
    slot. From /proc/<pid>/smaps_rollup, which walks the page tables (so only when the resident
    sum is over), looked at as the process's uid; a process that made itself undumpable, whose
    rollup cannot be read, counts its resident memory instead."""
    with contextlib.suppress(OSError), _looking_as(os.stat(f"/proc/{pid}").st_uid):
        for where in [f"/proc/{pid}"] + [
            f"/proc/{pid}/task/{tid}" for tid in os.listdir(f"/proc/{pid}/task")
        ]:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                found = _pss_fields(_read(f"{where}/smaps_rollup"))
                if found is not None:
                    return found
    return _resident(pid)


def _shared_part(pid: int) -> int:
    """What a process outside the slot holds, in Pss, of the anonymous pages it shares: a
    warm process's pages that the slot's forks of it map count once over all who map them,
    as a cold start's own would, instead of a third (the warm process, its reaper and the
    command). Its private pages (Private_Dirty) are left out. Pages it shares only with
    another such process (the originals of those a command copied on write) still count:
    over-counted by at most the warm process's memory, never missed."""
    with contextlib.suppress(OSError):
        rollup = _read(f"/proc/{pid}/smaps_rollup")
        found = _fields(rollup, (b"Pss_Anon:", b"Private_Dirty:"))
        return max(found.get(b"Pss_Anon:", 0) - found.get(b"Private_Dirty:", 0), 0) * KiB
    return 0


# kcmp, setresuid and setresgid by number: glibc's wrappers of the latter two change every
# thread of the process, the system calls only the calling one.
_SYSCALLS = {"x86_64": (312, 117, 119), "aarch64": (272, 147, 149)}
KCMP_VM = 1  # one address space
KCMP_FILES = 2  # one table of descriptors


def _shares(pid: int, other: int, kind: int, uid: int) -> bool:
    """Whether two processes (or threads) of `uid` share one kernel object of `kind`: a vfork
    child before its exec shares its parent's address space (KCMP_VM), and its figures show
    all of the parent's memory; a thread shares its group's descriptors (KCMP_FILES) unless it
    made a table of its own (unshare(CLONE_FILES)). kcmp is the kernel's own answer; its check
    is on the caller's real uid (no CAP_SYS_PTRACE on Fargate), so this thread alone takes the
    uid for the call, keeping root as its saved uid to return to. False when it cannot tell (an
    undumpable process): counted twice, or looked at twice, never missed."""
    kcmp, setresuid, setresgid = _SYSCALLS[platform.machine()]
    if _libc.syscall(setresgid, uid, uid, 0) != 0:
        return False
    try:
        if _libc.syscall(setresuid, uid, uid, 0) != 0:
            return False
        try:
            return bool(_libc.syscall(kcmp, pid, other, kind, 0, 0) == 0)
        finally:
            if _libc.syscall(setresuid, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "the watchdog could not take root back")
    finally:
        if _libc.syscall(setresgid, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "the watchdog could not take gid 0 back")


def _parent(pid: int) -> int:
    """The parent's pid, from /proc/<pid>/stat after the name (which a process sets), or 0."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(_read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1])
    return 0


def _once_per_mm(figures: dict[int, int]) -> int:
    """The sum of each process's figure (pid: bytes), an address space a child shares with
    its parent (vfork, posix_spawn, CLONE_VM) counted once: the parent's. Processes that
    share one otherwise (siblings by CLONE_PARENT) count each time."""
    total = 0
    for pid, figure in figures.items():
        if not figure:
            continue
        parent = _parent(pid)
        if parent in figures:
            with contextlib.suppress(OSError):
                uid = os.stat(f"/proc/{pid}").st_uid
                same = os.stat(f"/proc/{parent}").st_uid == uid
                if same and _shares(pid, parent, KCMP_VM, uid):
                    continue
        if parent == 0 or parent in figures:
            # Gone, or not sharing (no longer, once it has exec'd since its figure was read):
            # a fresh figure of its own.
            figure = _proportional(pid)
        total += figure
    return total


def _unmapped_sysv(uids: tuple[int, ...]) -> int:
    """Resident bytes of the uids' SysV segments that no process maps (those count there)."""
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return 0
    header = lines[0].split()
    # An old kernel has no rss column: the segment's size stands in for it.
    rss_col = header.index("rss" if "rss" in header else "size")
    uid_col, cuid_col = header.index("uid"), header.index("cuid")
    attach_col = header.index("nattch")
    total = 0
    for line in lines[1:]:
        fields = line.split()
        owned = int(fields[uid_col]) in uids or int(fields[cuid_col]) in uids
        if owned and int(fields[attach_col]) == 0:
            total += int(fields[rss_col])
    return total


def _shmem() -> int:
    """The machine's Shmem (every tmpfs page, memfd, SysV segment and shared mapping)."""
    return _fields(_read("/proc/meminfo"), (b"Shmem:",))[b"Shmem:"] * KiB


def _slab() -> int:
    """The machine's kernel slab: where a tmpfs's inodes are (an empty file, a directory)."""
    return _fields(_read("/proc/meminfo"), (b"Slab:",))[b"Slab:"] * KiB


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def _looking_as(uid: int) -> Iterator[None]:
    """This thread's file-system uid and gid switched to `uid`: /proc/<pid>/fd of a process of
    another uid needs CAP_SYS_PTRACE, which a Fargate task lacks, or the same fsuid and a
    dumpable process. setfsuid is per thread: the runner's other threads are untouched."""
    _libc.setfsgid(uid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


def _has_memory(task: str) -> bool:
    """Whether a thread (/proc/<pid>/task/<tid>) still has an address space: one that has
    none is exiting, a zombie, or a leader that exited alone, and never has one again."""
    with contextlib.suppress(OSError):
        return _rss_fields(_read(f"{task}/status")) is not None
    return False  # gone


def _open_files(pid: int, devices: set[int], seen: dict[tuple[int, int], int]) -> bool:
    """Record the memfds and unlinked tmpfs files `pid`'s threads hold open, each table of
    descriptors once (a thread may have one of its own: unshare(CLONE_FILES)); False when a
    thread that has its memory cannot be looked at (it made itself undumpable). A thread that
    has none any more shows its descriptors as root's too: it is exiting, or a zombie, or a
    leader that exited alone (its live threads hold the group's descriptors), not hiding. Such
    a thread of an honest program, beside a neighbour's shared memory, was charged it all."""
    looked: list[int] = []  # a thread of each table looked at
    with contextlib.suppress(OSError):  # gone
        for tid in map(int, os.listdir(f"/proc/{pid}/task")):
            task = f"/proc/{pid}/task/{tid}"
            try:
                uid = os.stat(task).st_uid
                if any(_shares(tid, other, KCMP_FILES, uid) for other in looked):
                    continue
                with _looking_as(uid):
                    _record_open_files(f"{task}/fd", devices, seen)
                looked.append(tid)
            except PermissionError:
                if _has_memory(task):
                    return False
            except OSError:  # this thread is gone
                pass
    return True


def _record_open_files(fds: str, devices: set[int], seen: dict[tuple[int, int], int]) -> None:
    """The memfds and unlinked tmpfs files in one /proc/.../fd directory."""
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):
            info = os.stat(f"{fds}/{fd}")
            if not stat.S_ISREG(info.st_mode) or info.st_nlink:
                continue
            memfd = os.readlink(f"{fds}/{fd}").startswith("/memfd:")
            if memfd or info.st_dev in devices:
                seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512


def _writable_by(info: os.stat_result, uids: tuple[int, ...]) -> bool:
    return bool(
        info.st_uid in uids
        or info.st_mode & stat.S_IWOTH
        or (info.st_mode & stat.S_IWGRP and info.st_gid in uids)
    )


def _unmapped_files(uids: tuple[int, ...], pids: list[int], places: list[Path], risen: int) -> int:
    """Bytes of tmpfs entries the uids own under `places` (pages and inodes), and of memfds
    and unlinked files their processes hold open, each file once. A process whose descriptors
    cannot be looked at is charged all the machine's Shmem rose by since the sandbox started
    (`risen`) instead: it hid."""
    seen: dict[tuple[int, int], int] = {}
    stack = [(place, True) for place in places]
    while stack:
        directory, writable = stack.pop()
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                # Only a directory the uids may write can hold a file of theirs (a link or a
                # rename into it needs that too): elsewhere only subdirectories are looked at.
                if not writable and not entry.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode) and not os.path.ismount(entry.path):
                        stack.append((Path(entry.path), _writable_by(info, uids)))
                    if info.st_uid in uids:  # a file, a directory, a link (its target's page)
                        seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512 + ENTRY_BYTES
    devices = {os.stat(place).st_dev for place in places if place.exists()}
    hidden = [pid for pid in pids if not _open_files(pid, devices, seen)]
    return max(sum(seen.values()), risen) if hidden else sum(seen.values())


class MemoryWatchdog:
    """Samples a slot's memory from `start` until `stop`; once it passes `limit_mb`, kills
    every process of the slot and sets `exceeded`. Two threads: the processes' memory, cheap
    and bounded by the slot's pids, is never held up by the part whose cost the sandbox
    controls (its sockets, files and descriptors: ~7 us a socket of the namespace)."""

    def __init__(
        self,
        uids: tuple[int, ...],
        limit_mb: int,
        places: list[Path],
        sharing: Callable[[], list[int]] = list,
    ) -> None:
        """`sharing`: processes outside the slot (its warm processes and their reapers, root)
        whose anonymous pages the slot's processes share, and are charged for in full."""
        self.uids = uids
        self.sharing = sharing
        self.limit = limit_mb * KiB * KiB
        self.places = places
        self.exceeded = False
        self.peak = 0
        self._done = threading.Event()
        self._kill = threading.Lock()
        # The machine's Shmem and slab at the last kernel sample, and what they rose by since:
        # rises only, never netted against what others freed meanwhile (a neighbour's release
        # of 300 MiB hid as much of the sandbox's own growth from a low-water mark).
        self._machine = (_shmem(), _slab())
        self._risen = 0  # Shmem, since the sandbox started: what a hidden process is charged
        self._grown = 0  # Shmem and slab, since the last walk began (or the start)
        self._deferred = False  # a walk was wanted but must wait: _grown counts meanwhile
        self._processes = 0  # bytes, and pids, of the last processes' sample
        self._pids: list[int] = []
        self._kernel = 0  # bytes of the last sockets-and-files sample
        self._unwalked = 0  # the machine's growth the last kernel sample did not walk
        self._files = 0  # bytes the last walk found
        self._next_walk = 0.0  # monotonic time before which no walk starts
        self._sockets = UnixSocketMemory()
        self._threads = [
            threading.Thread(target=self._watch_processes, name="memory-watchdog", daemon=True),
            threading.Thread(target=self._watch_kernel, name="memory-watchdog-k", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()

    @property
    def peak_mb(self) -> float:
        return round(self.peak / (KiB * KiB), 2)

    def _standing(self) -> int:
        """While a walk must wait (the sandbox made the last one slow), all the machine's
        shared memory rose by since the last walk began: however slow the sandbox makes its
        walks, growth between two is never unseen. Otherwise none: the walks follow the
        samples, and the growth between two is the sampling's gap, as any memory's."""
        if not self._deferred:
            return 0
        return self._grown + max(_shmem() - self._machine[0], 0)

    def _total(self) -> int:
        total = self._processes + self._kernel + self._standing()
        self.peak = max(self.peak, total)
        return total

    def _sample_processes(self) -> int:
        pids = _pids(self.uids)
        resident = sum(_resident(pid) for pid in pids)
        sysv = _unmapped_sysv(self.uids)
        if resident + sysv + self._kernel > self.limit:  # shared pages may count many times
            resident = _once_per_mm({pid: _proportional(pid) for pid in pids})
            resident += sum(_shared_part(pid) for pid in self.sharing())
        self._processes = resident + sysv
        self._pids = pids
        return self._total()

    def _sample_kernel(self) -> int:
        sockets = self._sockets.queued(self.uids) + kernel_memory.held_by(self.uids)
        shmem, slab = _shmem(), _slab()  # slab: a tmpfs's inodes (an empty file, a directory)
        rose = max(shmem - self._machine[0], 0)
        self._risen += rose
        self._grown += rose + max(slab - self._machine[1], 0)
        self._machine = (shmem, slab)
        # The walk costs more: only when the sandbox could be over, with the last walk's files
        # and all the machine's growth since as its own, and not when it is over without them.
        could_be = self._processes + sockets + self._files + self._grown
        if not self._processes + sockets <= self.limit < could_be:
            self._kernel, self._unwalked, self._deferred = sockets + self._files, self._grown, False
            return self._total()
        if time.monotonic() >= self._next_walk:
            self._grown, self._deferred = 0, False  # what grows during the walk is the next's
            started = time.thread_time()
            self._files = _unmapped_files(self.uids, self._pids, self.places, self._risen)
            # The walk's cost is the sandbox's to raise (its files): at most a share of a CPU
            # goes to it, its result standing in until the next, with all the machine's
            # shared memory rose by since it began (_standing).
            cost = time.thread_time() - started
            self._next_walk = time.monotonic() + cost * WALK_IDLE
        else:
            self._deferred = True
        self._kernel, self._unwalked = sockets + self._files, 0
        return self._total()

    def _next_wait(self, total: int) -> float:
        """Until the sandbox could have filled what is left of its limit, within bounds."""
        rate = ALLOC_RATE * (os.cpu_count() or 1)
        return min(max((self.limit - total - self._unwalked) / rate, SAMPLE_S), IDLE_S)

    def _watch(self, sample: Callable[[], int]) -> None:
        """Sample until stopped or over. A sample that fails counts as over the limit: a
        thread that stopped watching would leave the sandbox unbounded."""
        wait = SAMPLE_S
        while not self._done.wait(wait):
            try:
                total = sample()
            except Exception:
                log.exception("a memory sample of uids %s failed: counted as over", self.uids)
                return self._over()
            if total > self.limit:
                return self._over()
            wait = self._next_wait(total)

    def _watch_processes(self) -> None:
        self._watch(self._sample_processes)

    def _watch_kernel(self) -> None:
        with contextlib.closing(self._sockets):
            self._watch(self._sample_kernel)

    def _over(self) -> None:
        """Once, from whichever thread saw it: kill the slot and say so."""
        if not self._kill.acquire(blocking=False):
            return
        self.exceeded = True
        self._done.set()  # the other thread stops sampling
        try:
            # The last sample's first, at once (each ms of a kill's /proc scan is more
            # memory): only those still the slot's when signalled, as every kill.
            processes._signal(self._pids, self.uids, signal.SIGKILL)
            processes.kill_all(self.uids)
        except SandboxError:  # the runner's own kill_tree meets it again, and raises
            log.exception("the memory watchdog's kill of uids %s failed", self.uids)
