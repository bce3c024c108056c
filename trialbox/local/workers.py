"""The twin's pool: N worker processes, each `python -m trialbox.worker` (the Fargate
entrypoint, with the bwrap backend), signing as the pool's task role. A supervisor thread
keeps N alive: a worker that exits or is killed is replaced, as ECS replaces a stopped task,
and the job it held is lost the way a lost Fargate task's is (its heartbeat lapses and the
state machine retries it elsewhere). Each worker is an ECS task in the twin's moto, in a
memory cgroup of the task definition's size (trialbox.local.tasks): its name is the task's
ARN, and its end is recorded with the reason ECS would give.

Every worker is started by the supervisor thread with PR_SET_PDEATHSIG: when the caller dies,
however it dies, its workers die with it (and their sandboxes with them: bwrap's
--die-with-parent)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from trialbox import constants as c
from trialbox.local.tasks import TwinTask, TwinTasks

log = logging.getLogger("trialbox.local")

PR_SET_PDEATHSIG = 1
SUPERVISE_S = 0.1  # how often the supervisor looks for a stopped worker
STOP_WAIT_S = 3.0  # after SIGTERM, before SIGKILL, when the twin stops


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class WorkerPool:
    """`size` worker processes, kept at that size until `stop`."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, size: int, tasks: TwinTasks) -> None:
        self.env = dict(env)
        self.tasks = tasks
        self.reasons: list[str] = []  # why each stopped worker stopped, as ECS says it
        self.log_dir = log_dir
        self.size = size
        self.started = 0  # workers ever started (each one's log: worker-local-<n>.log)
        self.replaced = 0  # workers started in place of one that stopped
        self.retired = 0  # workers stopped because the pool shrank (an elastic twin)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._retiring: set[int] = set()  # pids told to stop because the pool shrank
        self._task: dict[int, TwinTask] = {}  # by worker pid
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._changed = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="twin-pool")

    def start(self) -> WorkerPool:
        self._thread.start()
        self.wait_for(self.size)
        return self

    def grow(self, by: int = 1) -> None:
        """`by` more workers, started by the supervisor."""
        with self._lock:
            self.size += by
        self._changed.set()
        self.wait_for(self.size)

    def resize(self, size: int, busy: Collection[str] = ()) -> None:
        """Grow to `size` (the supervisor starts the workers) or shrink to it, as ECS does
        when a service's desired count falls: SIGTERM to idle workers first (`busy`: the task
        ARNs of workers holding a job), the newest first; each finishes or hands back the job
        in hand (trialbox.worker: STOP_GRACE_S) and leaves its lease. The scaler shrinks a
        pool only after it idled (trialbox.pipeline.scaling), so none should hold one."""
        with self._lock:
            live = [p for p in self._procs if p.poll() is None and p.pid not in self._retiring]
            live.sort(key=lambda p: self._task[p.pid].arn not in busy)  # idle last, kept order
            self.size = size
            retire = live[size:] if len(live) > size else []
            for proc in retire:
                self._retiring.add(proc.pid)
        for proc in retire:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        self._changed.set()

    def pids(self) -> list[int]:
        """The live workers' pids."""
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.pids()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the twin's pool did not reach {count} worker(s)")
            time.sleep(0.02)

    def kill(self, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every live worker (a test's lost tasks); the supervisor replaces them."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        self._thread.join(timeout=10)
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # finish or hand back the job in hand
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.tasks.stopped(self._task.pop(proc.pid), proc.returncode)
        self.tasks.close()

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                stopped = [p for p in self._procs if p.poll() is not None]
                retired = {p.pid for p in stopped} & self._retiring
                for proc in stopped:
                    self._procs.remove(proc)
                    if proc.pid in retired:
                        self._retiring.discard(proc.pid)
                        self.retired += 1
                    else:
                        self.replaced += 1
            for proc in stopped:  # ECS's record of it, outside the lock (an HTTP call)
                try:
                    reason = self.tasks.stopped(self._task.pop(proc.pid), proc.returncode)
                except Exception:
                    log.exception("could not record twin worker %d's stop", proc.pid)
                    reason = "unknown"
                if proc.pid in retired:
                    log.info("twin worker %d stopped: the pool shrank (%s)", proc.pid, reason)
                    continue
                log.warning("twin worker %d stopped (%s); replacing it", proc.pid, reason)
                self.reasons.append(reason)
            with self._lock:
                try:
                    # Workers told to stop do not count: the pool is its live ones.
                    while len(self._procs) - len(self._retiring) < self.size:
                        self._procs.append(self._spawn())
                except Exception:  # e.g. the services stopping first: try again next round
                    log.exception("could not start a twin worker")
            self._changed.wait(SUPERVISE_S)
            self._changed.clear()

    def _spawn(self) -> subprocess.Popen[bytes]:
        log_name = f"local-{self.started}"
        self.started += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        task = self.tasks.start()

        def before_exec() -> None:  # pragma: no cover - runs in the child
            _die_with_parent()
            task.join()

        with (self.log_dir / f"worker-{log_name}.log").open("ab") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trialbox.worker"],
                env=self.env | {c.ENV_WORKER_NAME: task.arn},
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                preexec_fn=before_exec,  # the forking thread (the supervisor) lives on
            )
        self._task[proc.pid] = task
        return proc
