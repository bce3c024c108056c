"""LocalTwin: the pipeline on one machine. The AWS side (moto with state machines executing,
the stack's resources from the synthesized template, the handlers and the event-source
pollers) runs in a services process; N bwrap pool workers run here, with the worker loop
Fargate runs."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from trialbox import constants as c
from trialbox.local import principals
from trialbox.local.services import CREDENTIALS, ServicesProcess, client
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import Runner
from trialbox.worker.loop import RunJob, Worker
from trialbox.worker.run import job_runner


class LocalTwin:
    def __init__(self, workers: int = 2, heartbeat_s: int = 60, port: int = 0) -> None:
        self.workers = workers
        self.heartbeat_s = heartbeat_s
        self._dir = Path(tempfile.mkdtemp(prefix="trialbox-twin-"))
        self.services = ServicesProcess(port, heartbeat_s, self._dir / "logs")
        self._threads: list[threading.Thread] = []
        self._workers: list[Worker] = []

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

    def client(self, service: str) -> Any:
        return client(self.endpoint_url, service)

    def start(self) -> LocalTwin:
        self._runner = Runner()  # fails fast, with the missing piece named, on an unset machine
        self.services.start()
        for _ in range(self.workers):
            self.add_worker()
        return self

    def add_worker(self, run_job: RunJob | None = None) -> Worker:
        """One more pool worker (the same loop as on Fargate, with the bwrap backend, or
        `run_job` in its place), signing as the pool's task role."""

        def aws(service: str) -> Any:
            return client(self.endpoint_url, service, principals.WORKER)

        worker = Worker(
            sqs=aws("sqs"),
            sfn=aws("stepfunctions"),
            jobs=ObjectStore(aws("s3"), self.output(c.OUTPUT_TRACES_BUCKET)),
            queue_url=self.output(c.OUTPUT_WORK_QUEUE_URL),
            run_job=run_job or job_runner(self._runner),
            heartbeat_s=self.heartbeat_s,
            name=f"local-{len(self._workers)}",
            wait_s=1,
        )
        thread = threading.Thread(target=worker.serve, daemon=True, name=worker.name)
        thread.start()
        self._workers.append(worker)
        self._threads.append(thread)
        return worker

    def output(self, name: str) -> str:
        return self.outputs[name]

    def stop(self) -> None:
        for worker in self._workers:
            worker.stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.services.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalTwin:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
