"""Sandbox state private to one test process: a slot uid range, a state directory and a cgroup
parent that no other runner on the machine uses (another xdist worker, a second `make test`,
the demo, a developer's worker).

Slots are machine-wide (trialbox.sandbox.slots), and several tests assert on what is left of
every slot uid (no process, no file, no IPC object). Those assertions hold only where the
uids are the test process's own. A reservation is an flock on its index's file, held until
the process exits, so a range is never handed out twice while its holder lives (nor while a
process it started and left still names it), and a holder that died leaves it to the next
(the lowest free range is taken, and its runner sweeps what was left).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from trialbox.sandbox.config import ENV_PREFIX
from trialbox.sandbox.shared_files import try_exclusive

ROOT = Path("/var/lib/trialbox-tests")
FIRST_UID = 1_000_000
UIDS_PER_RESERVATION = 4096  # 2048 slots: far more than any test's pool
RESERVATIONS = 2000  # up to uid 9_192_000, inside the kernel's 32-bit uid space

_held: list[int] = []  # the flock fds: open for the life of the process


@dataclass(frozen=True)
class Reservation:
    index: int

    @property
    def uid_base(self) -> int:
        return FIRST_UID + self.index * UIDS_PER_RESERVATION

    @property
    def state_dir(self) -> Path:
        return ROOT / str(self.index)

    @property
    def cgroup_parent(self) -> str:
        return f"trialbox-test-{self.index}"

    def env(self) -> dict[str, str]:
        """The TRIALBOX_SANDBOX_* settings of a runner on this reservation (the sandbox
        runtime stays the machine's one)."""
        return {
            f"{ENV_PREFIX}STATE_DIR": str(self.state_dir),
            f"{ENV_PREFIX}UID_BASE": str(self.uid_base),
            f"{ENV_PREFIX}CGROUP_PARENT": self.cgroup_parent,
        }


def reserve() -> Reservation:
    """A range no live process holds, held until this process exits."""
    ROOT.mkdir(parents=True, exist_ok=True, mode=0o711)
    ROOT.chmod(0o711)  # the slot uids traverse it to their directories
    locks = ROOT / "locks"
    locks.mkdir(exist_ok=True, mode=0o700)
    in_use = _named_by_live_processes()
    for index in range(RESERVATIONS):  # the lowest free: a dead holder's is soon swept
        fd = try_exclusive(locks / f"{index}.lock")
        if fd is None:
            continue
        if str(Reservation(index).state_dir) in in_use:
            os.close(fd)
            continue
        _held.append(fd)
        return Reservation(index)
    raise RuntimeError(f"all {RESERVATIONS} test uid ranges under {locks} are held")


def _named_by_live_processes() -> set[str]:
    """The state directories in live processes' environments. A process a test started and
    left running (a leaked `local up`, its workers) still uses its reservation after the
    holder, whose lock its children do not inherit, has exited."""
    variable = f"{ENV_PREFIX}STATE_DIR=".encode()
    found: set[str] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for line in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    if line.startswith(variable):
                        found.add(line.removeprefix(variable).decode(errors="replace"))
    return found
