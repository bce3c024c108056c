"""The suite's sandbox pools (tests/support/pools.py): a process a test started and left running
keeps naming its pool's state after the test process exited, and that pool is not handed out
again while it lives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.pools import Reservation

ROOT = Path(__file__).resolve().parents[2]
RESERVE = "from tests.support.pools import reserve; print(reserve().index)"


def lowest_free() -> int:
    done = subprocess.run(
        [sys.executable, "-c", RESERVE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_a_pool_a_leftover_process_names_is_not_handed_out() -> None:
    free = lowest_free()  # its lock went with the process that took it
    leftover = subprocess.Popen(
        ["sleep", "60"], env=os.environ | Reservation(free).env(), start_new_session=True
    )
    try:
        assert lowest_free() != free
    finally:
        leftover.kill()
        leftover.wait()
