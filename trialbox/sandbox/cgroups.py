"""One cgroup per sandboxed command: memory, pids, cpu quota, freezer and accounting.

cgroup v1 (this machine: one hierarchy per controller) and v2 (most laptops: one unified tree)
sit behind one interface. Processes join through `procs_files`: the launch shim writes its own
pid into each before it execs, so no `preexec_fn` is needed in a threaded worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trialbox.errors import SandboxSetupError

CPU_PERIOD_US = 100_000
MiB = 1024 * 1024


@dataclass(frozen=True)
class CgroupStats:
    cpu_s: float
    peak_memory_mb: float
    oom_kills: int


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read_keyed(path: Path) -> dict[str, int]:
    """Parse `key value` lines (memory.oom_control, memory.events, cpu.stat)."""
    values: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


def _until(done: Callable[[], bool], timeout_s: float = 0.5) -> None:
    """Wait until `done()` (a freeze takes effect in a fraction of a millisecond, mostly):
    checked at once, then after sleeps that double from 50 us up to 2 ms."""
    deadline = time.monotonic() + timeout_s
    delay = 5e-5
    while not done() and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.002)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


class Cgroup(ABC):
    """A slot's cgroup. Where the version allows it, it is kept between commands and reset
    (counters and limits), which is cheaper than rmdir + mkdir on every launch."""

    REUSABLE = False

    def __init__(self, root: Path, parent: str, name: str) -> None:
        self.root = root
        self.parent = parent
        self.name = name
        self.dirs = self._dirs()
        self.procs_files = [d / "cgroup.procs" for d in self.dirs]
        self._oom_baseline = 0

    @abstractmethod
    def _dirs(self) -> list[Path]: ...

    @abstractmethod
    def _apply_limits(self, memory_mb: int, pids: int, cpus: float) -> None: ...

    def _reset_counters(self) -> None:  # noqa: B027 (only reusable versions override it)
        """Zero the peak-memory and CPU counters of a reused cgroup."""

    @abstractmethod
    def _freeze(self, frozen: bool) -> None: ...

    @abstractmethod
    def _read_stats(self) -> CgroupStats: ...

    def stats(self) -> CgroupStats:
        raw = self._read_stats()
        return CgroupStats(raw.cpu_s, raw.peak_memory_mb, raw.oom_kills - self._oom_baseline)

    def limit(self, memory_mb: int, pids: int, cpus: float) -> None:
        """New limits for the command already in it (counters kept)."""
        self._apply_limits(memory_mb, pids, cpus)

    def create(self, memory_mb: int, pids: int, cpus: float) -> None:
        """An empty cgroup with these limits and zeroed counters, ready for one command."""
        if self.REUSABLE and all(path.is_dir() for path in self.dirs) and self.wait_empty():
            try:
                self._apply_limits(memory_mb, pids, cpus)
                self._reset_counters()
                self._oom_baseline = self._read_stats().oom_kills
                return
            except OSError:
                pass  # e.g. EBUSY lowering a limit below current usage: start afresh
        self.remove()
        for path in self.dirs:
            path.mkdir(parents=True, exist_ok=False)
        self._apply_limits(memory_mb, pids, cpus)
        self._oom_baseline = 0

    def pids(self) -> set[int]:
        # Every member joins every controller, so one membership list is enough.
        with contextlib.suppress(FileNotFoundError):
            return {int(line) for line in self.procs_files[-1].read_text().split()}
        return set()

    def kill_all(self) -> None:
        """Freeze, SIGKILL every member, thaw: nothing can fork away between the steps."""
        members = self.pids()
        if not members:
            return
        self._freeze(True)
        for pid in members | self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._freeze(False)

    def wait_empty(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.pids():
            if time.monotonic() > deadline:
                return False
            self.kill_all()
            time.sleep(0.002)
        return True

    def remove(self) -> None:
        if not any(path.exists() for path in self.dirs):
            return
        if not self.wait_empty():
            raise SandboxSetupError(f"cgroup {self.name} still has processes after SIGKILL")
        for path in self.dirs:
            # cgroup.procs can empty slightly before its tasks are gone: retry briefly.
            for _ in range(500):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


class CgroupV1(Cgroup):
    # freezer last: its cgroup.procs is the membership list `pids()` reads.
    CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
    REUSABLE = True

    def _dirs(self) -> list[Path]:
        # Distributions often co-mount cpu and cpuacct ("cpu,cpuacct" with two symlinks).
        unique: dict[Path, Path] = {}
        for controller in self.CONTROLLERS:
            mount = self.root / controller
            unique.setdefault(mount.resolve(), mount / self.parent / self.name)
        return list(unique.values())

    def _dir(self, controller: str) -> Path:
        return self.root / controller / self.parent / self.name

    def _apply_limits(self, memory_mb: int, pids: int, cpus: float) -> None:
        memory = self._dir("memory")
        # memsw is set to the limit too (no swap escape hatch); it must never sit below the
        # plain limit, so the order depends on the direction of the change.
        limit = str(memory_mb * MiB)
        memsw = memory / "memory.memsw.limit_in_bytes"
        plain = memory / "memory.limit_in_bytes"
        order = (memsw, plain) if _read_int(plain) < memory_mb * MiB else (plain, memsw)
        for path in order:
            with contextlib.suppress(FileNotFoundError):  # absent without swap accounting
                _write(path, limit)
        _write(self._dir("pids") / "pids.max", str(pids))
        _write(self._dir("cpu") / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(self._dir("cpu") / "cpu.cfs_quota_us", str(round(cpus * CPU_PERIOD_US)))

    def _reset_counters(self) -> None:
        _write(self._dir("memory") / "memory.max_usage_in_bytes", "0")
        with contextlib.suppress(FileNotFoundError):
            _write(self._dir("memory") / "memory.memsw.max_usage_in_bytes", "0")
        _write(self._dir("cpuacct") / "cpuacct.usage", "0")

    def _freeze(self, frozen: bool) -> None:
        state = self._dir("freezer") / "freezer.state"
        with contextlib.suppress(FileNotFoundError):
            _write(state, "FROZEN" if frozen else "THAWED")
            if frozen:
                _until(lambda: state.read_text().strip() == "FROZEN")

    def _read_stats(self) -> CgroupStats:
        memory = self._dir("memory")
        peak = _read_int(memory / "memory.max_usage_in_bytes")
        return CgroupStats(
            cpu_s=_read_int(self._dir("cpuacct") / "cpuacct.usage") / 1e9,
            peak_memory_mb=round(peak / MiB, 2),
            oom_kills=_read_keyed(memory / "memory.oom_control").get("oom_kill", 0),
        )


class CgroupV2(Cgroup):
    """Recreated per command: v2's memory.peak cannot be reset on older kernels."""

    CONTROLLERS = ("memory", "pids", "cpu")

    def _dirs(self) -> list[Path]:
        return [self.root / self.parent / self.name]

    def _enable_controllers(self) -> None:
        parent = self.root / self.parent
        parent.mkdir(exist_ok=True)
        wanted = " ".join(f"+{c}" for c in self.CONTROLLERS)
        for level in (self.root, parent):
            enabled = (level / "cgroup.subtree_control").read_text().split()
            if not set(self.CONTROLLERS) <= set(enabled):
                _write(level / "cgroup.subtree_control", wanted)

    def create(self, memory_mb: int, pids: int, cpus: float) -> None:
        self._enable_controllers()
        super().create(memory_mb, pids, cpus)

    def _apply_limits(self, memory_mb: int, pids: int, cpus: float) -> None:
        path = self.dirs[0]
        _write(path / "memory.max", str(memory_mb * MiB))
        _write(path / "memory.swap.max", "0")
        _write(path / "pids.max", str(pids))
        _write(path / "cpu.max", f"{round(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")

    def _freeze(self, frozen: bool) -> None:
        path = self.dirs[0]
        _write(path / "cgroup.freeze", "1" if frozen else "0")
        if frozen:
            _until(lambda: _read_keyed(path / "cgroup.events").get("frozen") == 1)

    def kill_all(self) -> None:
        if self.pids():
            _write(self.dirs[0] / "cgroup.kill", "1")  # the kernel kills the whole tree at once

    def _read_stats(self) -> CgroupStats:
        path = self.dirs[0]
        return CgroupStats(
            cpu_s=_read_keyed(path / "cpu.stat").get("usage_usec", 0) / 1e6,
            peak_memory_mb=round(_read_int(path / "memory.peak") / MiB, 2),
            oom_kills=_read_keyed(path / "memory.events").get("oom_kill", 0),
        )


def cgroup_class(root: Path) -> type[Cgroup]:
    """v2 when `root` is a unified hierarchy, v1 when it holds per-controller mounts."""
    if (root / "cgroup.controllers").exists():
        return CgroupV2
    missing = [c for c in CgroupV1.CONTROLLERS if not (root / c / "cgroup.procs").exists()]
    if missing:
        raise SandboxSetupError(
            f"no usable cgroups under {root}: controllers {', '.join(missing)} are not mounted"
        )
    return CgroupV1
