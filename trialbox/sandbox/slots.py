"""Machine-wide sandbox slots. A slot is a pair of unprivileged uids (agent, grader) and two
directories. Tests, the demo and workers can run at once, so slots are claimed with lock files;
whoever claims a slot first removes what a killed runner left in it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trialbox.errors import SandboxSetupError
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.shared_files import try_exclusive

log = logging.getLogger("trialbox.sandbox")


@dataclass(frozen=True)
class Slot:
    index: int
    agent_uid: int
    grader_uid: int
    root: Path

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
        order = list(range(self.config.slots))
        random.shuffle(order)  # spread concurrent runners over the slots
        while True:
            for index in order:
                fd = self._try_lock(index)
                if fd is None:
                    continue
                try:
                    slot = self.slot(index)
                    if job:
                        self.used.add(index)
                    dirty = self._dirty_marker(index)
                    if dirty.exists():  # its last holder died holding it
                        self.sweep(slot)
                    dirty.touch()
                    try:
                        yield slot
                    except BaseException:
                        with contextlib.suppress(Exception):  # the body's error matters more
                            self.release(slot)
                            dirty.unlink()
                        raise
                    try:
                        self.release(slot)
                    except Exception as exc:  # the run is done and stands; the slot does not
                        log.exception("slot %d: release failed; it stays marked dirty", index)
                        self.release_failures.append(f"slot {index}: release failed: {exc!r}")
                        return
                    dirty.unlink()  # only a clean release leaves the slot unmarked
                    return
                finally:
                    os.close(fd)  # closing releases the lock
            if time.monotonic() > deadline:
                raise SandboxSetupError(
                    f"all {self.config.slots} sandbox slots stayed busy for "
                    f"{self.config.slot_wait_s:.0f} s; raise TRIALBOX_SANDBOX_SLOTS or run fewer "
                    "sandboxes at once"
                )
            time.sleep(0.05)

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
