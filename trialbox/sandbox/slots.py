"""Machine-wide sandbox slots. A slot is a pair of unprivileged uids (agent, grader) and two
directories. Tests, the demo and workers can run at once, so slots are claimed with lock files;
whoever claims a slot first removes what a killed runner left in it.

A slot whose processes are still dying when its holder gives it back (SIGKILL pending, in an
uninterruptible sleep past the kill's wait: see processes) is quarantined: the run's outcome
stands, and a thread keeps the slot's lock, so no one is given the slot, until they are
gone, then sweeps it again and frees it. If they outlive QUARANTINE_REPORT_S, that is a
release failure the worker's wipe check reports (Runner.residue), and it takes no more jobs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trialbox.errors import SandboxSetupError
from trialbox.sandbox import processes
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.shared_files import try_exclusive

log = logging.getLogger("trialbox.sandbox")

QUARANTINE_POLL_S = 0.1
QUARANTINE_REPORT_S = 300.0  # writeback of a page cache's worth of dirty data, with room


@dataclass(frozen=True)
class Slot:
    index: int
    agent_uid: int
    grader_uid: int
    root: Path
    # Set by whoever runs the job when its run is no longer wanted (cancelled, taken over):
    # the running command is killed and no further one starts (Backend.run raises Stopped).
    stop: threading.Event = field(default_factory=threading.Event, compare=False)

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    @property
    def grade_dir(self) -> Path:
        return self.root / "grade"

    @property
    def scratch_dir(self) -> Path:
        """The grader's HOME and TMPDIR where the backend gives it no private /tmp."""
        return self.root / "scratch"

    @property
    def cgroup_name(self) -> str:
        return f"slot-{self.index}"

    @property
    def uids(self) -> tuple[int, int]:
        return (self.agent_uid, self.grader_uid)


RECENT = 8  # slots a pool keeps trying first


class SlotPool:
    def __init__(
        self,
        config: SandboxConfig,
        sweep: Callable[[Slot], None],
        release: Callable[[Slot], None],
        sweep_many: Callable[[list[Slot]], None],
    ) -> None:
        self.config = config
        self.sweep = sweep
        self.release = release
        self.sweep_many = sweep_many
        self.slots_dir = config.state_dir / "slots"
        self.locks_dir = config.state_dir / "locks"
        # Releases that raised after a finished run: the slot stays marked dirty (its next
        # holder sweeps it first), and a worker takes no further job (Runner.residue).
        self.release_failures: list[str] = []
        # Slots claimed since the last `take_used`: only their uids can have left anything.
        self.used: set[int] = set()
        # The slots this pool held last, most recent first: tried before the others, so that
        # a runner keeps to a few slots, whose warm processes stay warm (warm.py).
        self._recent: list[int] = []

    def slot(self, index: int) -> Slot:
        uid = self.config.uid_base + 2 * index
        return Slot(index, uid, uid + 1, self.slots_dir / str(index))

    def _ensure_dirs(self) -> None:
        try:
            for path in (self.config.state_dir, self.slots_dir):
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o711)  # traversable by the slot uids, listable by nobody
            self.locks_dir.mkdir(exist_ok=True, mode=0o700)
        except PermissionError as exc:
            raise SandboxSetupError(
                f"cannot create the slot state under {self.config.state_dir}: {exc}. "
                "The sandbox runner needs root; run `make setup` as root."
            ) from exc

    @contextlib.contextmanager
    def acquire(self, job: bool = True) -> Iterator[Slot]:
        """A free slot, held until the body ends. `job`: count it among the slots the next
        wipe check inspects (`used`); a session's slot is held across jobs, and checked once
        it is given back."""
        self._ensure_dirs()
        deadline = time.monotonic() + self.config.slot_wait_s
        rest = [index for index in range(self.config.slots) if index not in self._recent]
        random.shuffle(rest)  # spread concurrent runners over the slots they do not keep
        order = self._recent + rest
        while True:
            for index in order:
                fd = self._try_lock(index)
                if fd is None:
                    continue
                quarantined = False
                try:
                    slot = self.slot(index)
                    if job:
                        self.used.add(index)
                    self._recent = [index, *(i for i in self._recent if i != index)][:RECENT]
                    dirty = self._dirty_marker(index)
                    if dirty.exists():  # its last holder died holding it
                        self.sweep(slot)
                    dirty.touch()
                    try:
                        yield slot
                    except BaseException:
                        with contextlib.suppress(Exception):  # the body's error matters more
                            quarantined = self._give_back(slot, fd, dirty)
                        raise
                    quarantined = self._give_back(slot, fd, dirty)
                    return
                finally:
                    if not quarantined:
                        os.close(fd)  # closing releases the lock
            if time.monotonic() > deadline:
                raise SandboxSetupError(
                    f"all {self.config.slots} sandbox slots stayed busy for "
                    f"{self.config.slot_wait_s:.0f} s; raise TRIALBOX_SANDBOX_SLOTS or run fewer "
                    "sandboxes at once"
                )
            time.sleep(0.05)

    def _give_back(self, slot: Slot, fd: int, dirty: Path) -> bool:
        """Release the slot after its holder. True when its lock (`fd`) went to a quarantine
        thread: its processes are still dying, and it is not free until they are gone."""
        try:
            self.release(slot)
        except Exception as exc:  # the run is done and stands; the slot does not
            failure: Exception | None = exc
        else:
            failure = None
        if processes.processes_of(slot.uids):
            log.warning("slot %d: its processes are still dying; quarantined", slot.index)
            threading.Thread(
                target=self._quarantine, args=(slot, fd, dirty), name="slot-quarantine", daemon=True
            ).start()
            return True
        if failure is not None:
            log.error(
                "slot %d: release failed; it stays marked dirty", slot.index, exc_info=failure
            )
            self.release_failures.append(f"slot {slot.index}: release failed: {failure!r}")
            return False
        dirty.unlink()  # only a clean release leaves the slot unmarked
        return False

    def _quarantine(self, slot: Slot, fd: int, dirty: Path) -> None:
        """Hold the slot's lock until no process of its uids is left, then sweep it (what they
        finished on their way out) and free it for the next holder."""
        started = time.monotonic()
        reported = False
        try:
            while processes.processes_of(slot.uids):
                with contextlib.suppress(Exception):  # SIGKILL again: one may not be dying
                    processes.kill_all(slot.uids)
                if not reported and time.monotonic() - started > QUARANTINE_REPORT_S:
                    reported = True
                    self.release_failures.append(
                        f"slot {slot.index}: processes of its uids outlived SIGKILL for "
                        f"{QUARANTINE_REPORT_S:.0f} s"
                    )
                time.sleep(QUARANTINE_POLL_S)
            self.sweep(slot)
            dirty.unlink()
            self.used.add(slot.index)  # the next wipe check inspects it
        except Exception as exc:
            log.exception("slot %d: the sweep after its quarantine failed", slot.index)
            self.release_failures.append(f"slot {slot.index}: release failed: {exc!r}")
        finally:
            os.close(fd)

    def _try_lock(self, index: int) -> int | None:
        """The slot's lock fd, held (closing it releases the lock); None if another holds it."""
        return try_exclusive(self.locks_dir / f"{index}.lock")

    def _dirty_marker(self, index: int) -> Path:
        return self.locks_dir / f"{index}.dirty"

    @contextlib.contextmanager
    def idle(self, indexes: list[int]) -> Iterator[list[Slot]]:
        """Those of `indexes` no live runner holds, held (by lock) while the body runs."""
        self._ensure_dirs()
        held: dict[int, int] = {}  # slot index -> its lock fd
        try:
            for index in indexes:
                fd = self._try_lock(index)
                if fd is not None:
                    held[index] = fd
            yield [self.slot(index) for index in held]
        finally:
            for fd in held.values():
                os.close(fd)

    def sweep_idle(self) -> int:
        """Startup sweep: clean every slot no live runner holds, in one pass (`sweep_many`).
        Returns how many were swept."""
        with self.idle(list(range(self.config.slots))) as idle:
            self.sweep_many(idle)
            for slot in idle:
                self._dirty_marker(slot.index).unlink(missing_ok=True)
        return len(idle)
