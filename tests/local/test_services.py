"""The twin's services process never outlives its caller, however the caller ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.processes import alive, descendants

CALLER = (
    "import time\n"
    "from trialbox.local.twin import LocalTwin\n"
    "twin = LocalTwin(workers=2).start()\n"
    "print(twin.services._process.pid, twin._dir, *twin.pool.pids(), flush=True)\n"
    "time.sleep(600)\n"
)


def test_services_functions_and_workers_exit_when_the_caller_is_killed() -> None:
    caller = subprocess.Popen([sys.executable, "-c", CALLER], stdout=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    pid, twin_dir, *workers = caller.stdout.readline().split()
    services = int(pid)
    assert Path(twin_dir, "logs").is_dir()
    family = {services} | descendants(services)
    assert len(family) > 4  # the services process and its function processes
    assert len(workers) == 2  # the pool's worker processes
    family |= {int(w) for w in workers}
    os.kill(caller.pid, signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in family if alive(pid)]
    assert not Path(twin_dir).exists()  # the logs went with the services process


def test_a_caller_gone_while_services_start_leaves_nothing_behind(tmp_path: Path) -> None:
    """Ctrl-C during `starting the local twin...`: the ready line meets a closed pipe."""
    twin_dir = tmp_path / "trialbox-twin-x"
    log_dir = twin_dir / "logs"
    log_dir.mkdir(parents=True)
    services = subprocess.Popen(
        [sys.executable, "-m", "trialbox.local.services", "0", "60", str(log_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert services.stdout is not None and services.stdin is not None
    services.stdout.close()  # the caller went away before the twin was ready
    services.stdin.close()
    family = {services.pid} | descendants(services.pid)
    assert services.wait(timeout=120) == 0
    deadline = time.monotonic() + 15
    while (
        any(alive(pid) for pid in family | descendants(services.pid))
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert not twin_dir.exists()
