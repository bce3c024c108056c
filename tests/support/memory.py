"""A sandbox's memory measured from outside, independently of the rlimit backend's watchdog."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

MiB = 1024 * 1024


def _resident(proc: str) -> int:
    """Pss_Anon + Pss_Shmem of a thread group: each page counted once however many processes
    map it (a forked child's copy-on-write pages, a mapped memfd), as the watchdog counts
    (RssAnon + RssShmem counted a page per process that maps it: an honest program of eight
    forked interpreters was sampled at 543 MiB under a 512 MiB limit it never reached). A
    leader that exited shows nothing while its other threads live on: any live thread's
    rollup has the group's."""
    paths = [Path(proc, "smaps_rollup"), *Path(proc, "task").glob("*/smaps_rollup")]
    for rollup_path in paths:
        with contextlib.suppress(OSError):
            rollup = rollup_path.read_text()
            if "Pss_Anon:" in rollup:
                fields = ("Pss_Anon:", "Pss_Shmem:")
                return sum(int(rollup.split(f)[1].split()[0]) * 1024 for f in fields)
    return 0


def memory_of(uids: tuple[int, ...] | range, shm: Path = Path("/dev/shm")) -> int:
    """Bytes: every process's proportional anonymous and shared memory, the uids' files on
    `shm`, and the memfds and unlinked files their processes' threads hold open."""
    total, files = 0, {}
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError):
            if not entry.name.isdigit() or entry.stat().st_uid not in uids:
                continue
            total += _resident(entry.path)
            # Every thread's table: one may have its own (unshare(CLONE_FILES)).
            for task in os.listdir(f"{entry.path}/task"):
                with contextlib.suppress(OSError):
                    fds = f"{entry.path}/task/{task}/fd"
                    for fd in os.listdir(fds):
                        with contextlib.suppress(OSError):
                            info = os.stat(f"{fds}/{fd}")
                            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                                files[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    for path in shm.iterdir():
        with contextlib.suppress(OSError):
            info = path.lstat()
            if info.st_uid in uids and stat.S_ISREG(info.st_mode):
                files[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return total + sum(files.values())


@contextlib.contextmanager
def peak_memory(measure: Callable[[], int], every_s: float = 0.01) -> Iterator[list[int]]:
    """Sample `measure` every `every_s` while the body runs; yields [peak bytes]."""
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            peak[0] = max(peak[0], measure())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
