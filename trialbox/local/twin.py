"""LocalTwin: the pipeline on one machine. The AWS side (moto with state machines executing,
the stack's resources from the synthesized template, the handlers and the event-source
pollers) runs in a services process; N pool workers run as child processes, each the
Fargate entrypoint (`python -m trialbox.worker`) with the bwrap backend
(trialbox.local.workers)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from trialbox import aws_retries
from trialbox import constants as c
from trialbox.local import principals
from trialbox.local.faults import Quotas, environment
from trialbox.local.services import CREDENTIALS, ENV_SCALER_OVERRIDES, ServicesProcess, client
from trialbox.local.tasks import TaskShape, TwinTasks
from trialbox.local.workers import WorkerPool
from trialbox.pipeline.admission import Admission
from trialbox.sandbox.runner import Runner

log = logging.getLogger("trialbox.local")

# A twin worker told to stop hands its job back this soon (Fargate gives up to 90 s).
STOP_GRACE_S = 2
FOLLOW_S = 0.2  # how often an elastic twin's pool reads its service's desired count
# An elastic twin's scaler: the deployed one's rule on a twin's time scale.
SCALER_TICK_S = 0.5
SCALER_RUN_S = 8.0  # each scheduled run (the twin's schedules run every 10 s at most)


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
        max_workers: int | None = None,
        scale_in_idle_s: float = 5.0,
        scaler_tick_s: float | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        """`worker_memory_mb`: each worker's memory cgroup (the task definition's otherwise).
        `faults`: the share of the SDK's, the workers' and the functions' AWS calls answered
        with a throttle or a 5xx, as AWS answers them (trialbox.local.faults); `faults_seed`
        makes the draw repeatable; `faults_applied`: the share of those 5xx that come after
        the call took effect. `quotas`: rate quotas scaled down, by "service:Operation"
        (e.g. {"states:StartExecution": (1.0, 4.0)}: a refill a second, a bucket).

        `max_workers`: an elastic pool, of `workers` (the warm minimum) to `max_workers`. The
        stack's scaler (functions/scaler, on the twin's schedule) sets the pool's ECS service's
        desired count every `scaler_tick_s` (SCALER_TICK_S if None), scaling in after
        `scale_in_idle_s` idle, and the pool follows it. None (the default): `workers` workers,
        always, whatever the scaler sets (which then runs on the template's timing, unless
        `scaler_tick_s` is given: then on the twin's, with `scale_in_idle_s`)."""
        services_env = environment(faults, faults_seed, faults_applied, quotas)  # checked first
        overrides: dict[str, str] = {}
        if max_workers is not None:
            if max_workers < max(1, workers):
                raise ValueError(f"max_workers {max_workers} is below workers {workers}")
            overrides = {
                c.ENV_POOL_MIN_TASKS: str(workers),
                c.ENV_POOL_MAX_TASKS: str(max_workers),
            }
            scaler_tick_s = scaler_tick_s or SCALER_TICK_S
        if scaler_tick_s is not None:
            overrides |= {
                c.ENV_SCALE_IN_IDLE_S: str(scale_in_idle_s),
                c.ENV_SCALER_TICK_S: str(scaler_tick_s),
                c.ENV_SCALER_RUN_S: str(SCALER_RUN_S),
            }
        if overrides:
            services_env[ENV_SCALER_OVERRIDES] = json.dumps(overrides)
        self.max_workers = max_workers
        self.faults = faults
        self.workers = workers
        self.worker_memory_mb = worker_memory_mb
        self.heartbeat_s = heartbeat_s
        self._dir = Path(tempfile.mkdtemp(prefix="trialbox-twin-"))
        self.services = ServicesProcess(port, heartbeat_s, self._dir / "logs", services_env)
        self.pool: WorkerPool | None = None
        self._following = threading.Event()  # set: the follower stops
        self._follower: threading.Thread | None = None

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
            c.ENV_POOL_CAPACITY: str(self.max_workers or self.workers),
            c.ENV_OPEN_QUEUE_URL: outputs[c.OUTPUT_OPEN_QUEUE_URL],
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
        size = self.workers if self.max_workers is None else self._desired(ecs)
        self.pool = WorkerPool(self.worker_env(), self._dir / "logs", size, tasks).start()
        if self.max_workers is not None:
            self._follower = threading.Thread(
                target=self._follow, args=(ecs,), daemon=True, name="twin-service"
            )
            self._follower.start()
        return self

    def _desired(self, ecs: Any) -> int:
        """The pool's service's desired count, within the twin's maximum."""
        answer = ecs.describe_services(
            cluster=self.output(c.OUTPUT_CLUSTER), services=[self.services.service]
        )
        assert self.max_workers is not None
        return min(int(answer["services"][0]["desiredCount"]), self.max_workers)

    def _follow(self, ecs: Any) -> None:
        """An elastic pool follows its service's desired count, as ECS starts and stops tasks."""
        assert self.pool is not None
        while not self._following.wait(FOLLOW_S):
            try:
                desired = self._desired(ecs)
            except Exception:  # the services stopping with the twin: the next read decides
                log.warning("reading the pool's desired count failed", exc_info=True)
                continue
            if desired == self.pool.size:
                continue
            log.info("the pool follows its service: %d -> %d", self.pool.size, desired)
            try:
                busy = self._busy() if desired < self.pool.size else set()
            except Exception:
                log.warning("reading which workers hold a job failed", exc_info=True)
                continue
            self.pool.resize(desired, busy)

    def _busy(self) -> set[str]:
        """The workers (task ARNs) holding an admitted job: an elastic pool stops them last."""
        markers = Admission(
            client(self.endpoint_url, "dynamodb", principals.SETUP),
            self.output(c.OUTPUT_ADMISSION_TABLE),
        ).admitted()
        return {m.taken_by for m in markers.values() if m.taken_by}

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
                c.ENV_SESSION_QUEUE_PREFIX: self.output(c.OUTPUT_SESSION_QUEUE_PREFIX),
                c.ENV_OPEN_QUEUE_URL: self.output(c.OUTPUT_OPEN_QUEUE_URL),
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
        self._following.set()
        if self._follower is not None:
            self._follower.join(timeout=5)
        if self.pool is not None:
            self.pool.stop()
        self.services.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalTwin:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
