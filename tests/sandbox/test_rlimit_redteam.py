"""Red-team cases against the rlimit backend's clean-up on the host (tests/fargate/test_redteam.py
runs the same attacks under the task definition's constraints, where they race the scheduler).

The cases here are deterministic versions of one break, now fixed: the worker cleaned up a
slot uid from a forked child that switched to the uid and only then called kill(-1). Between
the two, any process of that uid could signal the child; and `processes_of`, which decides that
the uid has no process left, skipped a process whose thread-group leader exited while its
other threads ran. Kills now come from root (trialbox/sandbox/processes.py); the uid's own
children still make the IPC and keyring clean-up, once it has no process left.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.pools import reserve
from tests.support.programs import hunter
from trialbox.models import Limits
from trialbox.sandbox import as_uid, processes
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.fs import remove_tree
from trialbox.sandbox.runner import Runner

SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]


@pytest.fixture(scope="module")
def rlimit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    own = reserve()  # one slot, apart from every other runner's uids
    state = own.state_dir
    config = SandboxConfig.from_env().model_copy(
        update={"backend": "rlimit", "slots": 1, "state_dir": state, "uid_base": own.uid_base}
    )
    runner = Runner(config)
    try:
        yield runner
    finally:
        processes.kill_all(runner.slots.slot(0).uids)
        remove_tree(state)


def test_processes_of_sees_a_process_whose_leader_exited(rlimit: Runner) -> None:
    """Was a break: the leader exits alone (SYS_exit), a thread keeps running; /proc/<pid>/stat
    says Z, and `processes_of` (the kill loop's and `residue`'s check) reported nothing."""
    uid = rlimit.config.uid_base + 7  # in the reservation, outside its one slot
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as the uid, a live thread behind a dead leader
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)

            def linger() -> None:
                os.write(ready_w, b"1")
                time.sleep(30)
                os._exit(0)

            threading.Thread(target=linger).start()
            ctypes.CDLL(None).syscall(SYS_EXIT, 0)
        finally:
            os._exit(1)
    try:
        os.read(ready_r, 1)
        time.sleep(0.2)
        assert sorted(os.listdir(f"/proc/{pid}/task")) != [str(pid)]  # a thread is alive
        assert processes.processes_of((uid,)) == [pid]
    finally:
        processes.kill_all((uid,))
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_a_stopped_cleanup_child_does_not_wedge_the_runner(
    rlimit: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: a process of the slot uid SIGSTOPs the worker's clean-up child between its
    uid switch and its kill(-1); the runner's waitpid never returns. The switch-to-kill window
    is widened here to 20 ms (a preemption there does the same on a busy task), so that the
    outcome does not depend on the scheduler; tests/fargate wins it without help."""
    switch_then = as_uid.make_undumpable

    def slow() -> None:
        switch_then()
        time.sleep(0.02)

    monkeypatch.setattr(as_uid, "make_undumpable", slow)
    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(rlimit.exec(["python", "-c", hunter("stop")], Limits())),
        daemon=True,
    )
    worker.start()
    worker.join(20)
    wedged = not done
    if wedged:  # free the runner: the stopped child is killed by root
        processes.kill_all(rlimit.slots.slot(0).uids)
        worker.join(10)
    assert not wedged, "the runner waited 20 s for a clean-up child the job had stopped"


def test_a_hunter_cannot_survive_into_the_next_command(
    rlimit: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: with the same window, the hunter SIGKILLs every clean-up child and hides
    behind its exited leader; the wipe and `residue` find nothing, and the next command of
    the slot finds the hunter's marker in its fresh workspace."""
    switch_then = as_uid.make_undumpable

    def slow() -> None:
        switch_then()
        time.sleep(0.02)

    monkeypatch.setattr(as_uid, "make_undumpable", slow)
    try:
        left = rlimit.exec(["python", "-c", hunter("kill", 20)], Limits())
        assert left.stdout == "hunter started\n", left
        residue = rlimit.residue()
        look = "import os, time\ntime.sleep(1.5)\nprint(sorted(os.listdir('.')))\n"
        victim = rlimit.exec(["python", "-c", look], Limits())
        assert (residue, victim.stdout) == ([], "[]\n")
    finally:
        processes.kill_all(rlimit.slots.slot(0).uids)
