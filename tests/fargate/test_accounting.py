"""The performance scorer's CPU figure on the worker, as the task definition runs it (rlimit
backend, no cgroup): a solution that does its slow work in processes its timed run never
waits for is as slow as one that does it itself (trialbox/sandbox/reaper.py)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.fargate.harness import Service
from tests.fargate.submit import run_jobs
from tests.support.performance_attacks import SLOW, perf_task
from trialbox.models import ExecutionRequest, Status
from trialbox.sdk import Client

SLOW_WITH_OS = "import os\n" + SLOW  # four times the reference's work
HONEST = SLOW_WITH_OS + "def total(n):\n    return _slow(n)\n"
# The slow work in a child never waited for (the red team's offload), and in a daemon.
OFFLOADED = {
    "unwaited_child": "    if os.fork() == 0:\n",
    "double_fork_setsid": "    if os.fork() == 0:\n        os.setsid()\n        if os.fork():\n"
    "            os._exit(0)\n",
}


def _offloaded(fork: str) -> str:
    return SLOW_WITH_OS + (
        "def total(n):\n"
        "    if n <= 1000:\n"
        "        return _slow(n)\n"
        "    r, w = os.pipe()\n"
        f"{fork}"
        "        os.write(w, str(_slow(n)).encode()); os._exit(0)\n"
        "    os.close(w)\n"
        "    data = b''\n"
        "    while chunk := os.read(r, 64):\n"
        "        data += chunk\n"
        "    return int(data)\n"
    )


def _job(code: str) -> ExecutionRequest:
    body: dict[str, Any] = {
        "request_id": f"fg-acct-{uuid.uuid4().hex[:12]}",
        "task": perf_task(tolerance=0.1).model_dump(mode="json", exclude_none=True),
        "files": {"solution.py": code},
        "grade": True,
    }
    return ExecutionRequest.model_validate(body)


def test_offloaded_work_is_as_slow_as_honest_work(client: Client, service: Service) -> None:
    codes = [HONEST, *(_offloaded(fork) for fork in OFFLOADED.values())]
    results = run_jobs(client, service, [_job(code) for code in codes], timeout=300)
    cpu = []
    for result in results:
        assert result.status == Status.SUCCEEDED, result.error
        assert result.reward is not None and result.reward < 0.6, result.reward_breakdown
        cpu.append(float(result.reward_breakdown["cpu_s"]))
    honest, *offloaded = cpu
    for name, seconds in zip(OFFLOADED, offloaded, strict=True):
        # The attack under-reports (0.02 s for 0.63 s): each offload's CPU is the honest
        # run's, within what a loaded machine adds to one measurement or the other.
        assert seconds >= 0.6 * honest, (name, seconds, honest)
