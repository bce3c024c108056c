"""LocalTwin: the pipeline on one machine. The AWS side (moto with state machines executing,
the stack's resources from the synthesized template, the handlers and the event-source
pollers) runs in a services process; N pool workers run as child processes, each the
Fargate entrypoint (`python -m trialbox.worker`) with the bwrap backend
(trialbox.local.workers)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from trialbox import aws_retries
from trialbox import constants as c
from trialbox.local import principals
from trialbox.local.faults import Quotas, environment
from trialbox.local.services import CREDENTIALS, ServicesProcess, client
from trialbox.local.tasks import TaskShape, TwinTasks
from trialbox.local.workers import WorkerPool
from trialbox.pipeline.admission import Admission
from trialbox.sandbox.runner import Runner

# A twin worker told to stop hands its job back this soon (Fargate gives up to 90 s).
STOP_GRACE_S = 2


class LocalTwin:
    def __init__(
        self,
        workers: int = 2,
        heartbeat_s: int = 60,
        port: int = 0,
        worker_memory_mb: int | None = None,
        faults: float = 0.0,
        faults_seed: int | None = None,
        faults_applied: float = 0.0,
        quotas: Quotas | None = None,
    ) -> None:
        """`worker_memory_mb`: each worker's memory cgroup (the task definition's otherwise).
        `faults`: the share of the SDK's, the workers' and the functions' AWS calls answered
        with a throttle or a 5xx, as AWS answers them (trialbox.local.faults); `faults_seed`
        makes the draw repeatable; `faults_applied`: the share of those 5xx that come after
        the call took effect. `quotas`: rate quotas scaled down, by "service:Operation"
        (e.g. {"states:StartExecution": (1.0, 4.0)}: a refill a second, a bucket)."""
        services_env = environment(faults, faults_seed, faults_applied, quotas)  # checked first
        self.faults = faults
        self.workers = workers
        self.worker_memory_mb = worker_memory_mb
        self.heartbeat_s = heartbeat_s
        self._dir = Path(tempfile.mkdtemp(prefix="trialbox-twin-"))
        self.services = ServicesProcess(port, heartbeat_s, self._dir / "logs", services_env)
        self.pool: WorkerPool | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.services.port}"

    @property
    def outputs(self) -> dict[str, str]:
        """The stack outputs, by the names the SDK reads."""
        return self.services.outputs

    @property
    def env(self) -> dict[str, str]:
        """What an SDK user needs to reach this twin."""
        return CREDENTIALS | {"AWS_ENDPOINT_URL": self.endpoint_url}

    def sdk_env(self) -> dict[str, str]:
        """The environment an SDK process needs to reach this twin (`trialbox local up` prints
        it): the credentials and endpoint, and the stack's resources by TRIALBOX_* names."""
        outputs = self.outputs
        return self.env | {
            c.ENV_ENDPOINT_URL: self.endpoint_url,
            c.ENV_REQUESTS_QUEUE_URL: outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
            c.ENV_EXECUTIONS_TABLE: outputs[c.OUTPUT_EXECUTIONS_TABLE],
            c.ENV_TRACES_BUCKET: outputs[c.OUTPUT_TRACES_BUCKET],
            c.ENV_TASKSETS_BUCKET: outputs[c.OUTPUT_TASKSETS_BUCKET],
            c.ENV_ROLLOUT_ARN: outputs[c.OUTPUT_ROLLOUT_ARN],
            c.ENV_POOL_CAPACITY: str(self.workers),
            c.ENV_WORK_QUEUE_URL: outputs[c.OUTPUT_WORK_QUEUE_URL],
            c.ENV_SESSION_QUEUE_PREFIX: outputs[c.OUTPUT_SESSION_QUEUE_PREFIX],
            c.ENV_CLUSTER: outputs[c.OUTPUT_CLUSTER],
        }

    def client(self, service: str) -> Any:
        return client(self.endpoint_url, service)

    def start(self) -> LocalTwin:
        Runner()  # fails fast, with the missing piece named, on an unset machine
        self.services.start()
        ecs = client(self.endpoint_url, "ecs", principals.SETUP)  # ECS's own doing
        task = self.services.task_definition
        shape = TaskShape(self.output(c.OUTPUT_CLUSTER), task["family"], task["memory_mb"])
        tasks = TwinTasks(ecs, shape, self.worker_memory_mb)
        self.pool = WorkerPool(self.worker_env(), self._dir / "logs", self.workers, tasks).start()
        return self

    def worker_env(self) -> dict[str, str]:
        """A pool worker's environment: this process's (the sandbox settings with it), the
        stack's values as the task definition passes them, and the task role's credentials."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return (
            inherited
            | CREDENTIALS
            | aws_retries.ENVIRONMENT  # as the task definition sets it
            | {
                "AWS_ACCESS_KEY_ID": principals.WORKER,
                "AWS_ENDPOINT_URL": self.endpoint_url,
                c.ENV_TRACES_BUCKET: self.output(c.OUTPUT_TRACES_BUCKET),
                c.ENV_WORK_QUEUE_URL: self.output(c.OUTPUT_WORK_QUEUE_URL),
                c.ENV_FINISH_QUEUE_URL: self.output(c.OUTPUT_FINISH_QUEUE_URL),
                c.ENV_ADMISSION_TABLE: self.output(c.OUTPUT_ADMISSION_TABLE),
                c.ENV_HEARTBEAT_S: str(self.heartbeat_s),
                c.ENV_STOP_GRACE_S: str(STOP_GRACE_S),
            }
        )

    def add_worker(self) -> None:
        """One more pool worker process."""
        assert self.pool is not None, "start the twin first"
        self.pool.grow()

    def output(self, name: str) -> str:
        return self.outputs[name]

    def leased(self, slots: int, timeout_s: float = 60.0) -> Admission:
        """The admission table, once the workers' leases hold `slots` (so that one dispatcher
        invocation can admit that many together)."""
        admission = Admission(self.client("dynamodb"), self.output(c.OUTPUT_ADMISSION_TABLE))
        deadline = time.monotonic() + timeout_s
        while admission.capacity() < slots:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the twin's workers never leased {slots} slot(s)")
            time.sleep(0.2)
        return admission

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        self.services.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalTwin:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
