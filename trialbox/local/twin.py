"""LocalTwin: moto in server mode on 127.0.0.1 with state machines executing, the stack's
resources and state machines from the synthesized template, the handlers, the event-source
pollers and N bwrap pool workers."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
import requests
from moto.server import ThreadedMotoServer

from trialbox import constants as c
from trialbox.local import patches
from trialbox.local.functions import FunctionHost
from trialbox.local.poller import Poller
from trialbox.local.resources import REGION, LocalStack, create
from trialbox.local.template import load_template
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import Runner
from trialbox.worker.loop import Worker
from trialbox.worker.run import job_runner

log = logging.getLogger("trialbox.local")
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": REGION,
}
MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}


class LocalTwin:
    def __init__(self, workers: int = 2, heartbeat_s: int = 60, port: int = 0) -> None:
        self.workers = workers
        self.heartbeat_s = heartbeat_s
        self.port = port
        self.stack = LocalStack()
        self._threads: list[Any] = []
        self._workers: list[Worker] = []
        self._dir = Path(tempfile.mkdtemp(prefix="trialbox-twin-"))

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What an SDK user (or a handler) needs to reach this twin."""
        return CREDENTIALS | {"AWS_ENDPOINT_URL": self.endpoint_url}

    def client(self, service: str) -> Any:
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def start(self) -> LocalTwin:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        # moto's interpreter calls services at localhost:MOTO_PORT.
        os.environ["MOTO_PORT"] = str(self.port)
        # moto's backends are process-wide: a twin starts from an empty account.
        requests.post(f"{self.endpoint_url}/moto-api/reset", timeout=10)
        requests.post(f"{self.endpoint_url}/moto-api/config", json=MOTO_CONFIG, timeout=10)
        clients = {s: self.client(s) for s in ("s3", "sqs", "dynamodb", "stepfunctions")}
        self.stack = create(load_template(), clients)
        self.functions = FunctionHost(
            self.stack.functions,
            self.env
            | {
                "POWERTOOLS_TRACE_DISABLED": "true",
                c.ENV_HEARTBEAT_S: str(self.heartbeat_s),
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            },
            self._dir / "logs",
        )
        self.functions.start()
        patches.route_lambda_invocations(self.functions.invoke)
        patches.keep_early_callbacks()
        patches.accept_early_heartbeats()
        for mapping in self.stack.mappings:
            poller = Poller(self.client("sqs"), mapping, self.functions.invoke)
            poller.start()
            self._threads.append(poller)
        self._runner = Runner()
        for _ in range(self.workers):
            self.add_worker()
        return self

    def add_worker(self) -> Worker:
        """One more pool worker (the same loop as on Fargate, with the bwrap backend)."""
        worker = Worker(
            sqs=self.client("sqs"),
            sfn=self.client("stepfunctions"),
            jobs=ObjectStore(self.client("s3"), self.output(c.OUTPUT_TRACES_BUCKET)),
            queue_url=self.output(c.OUTPUT_WORK_QUEUE_URL),
            run_job=job_runner(self._runner),
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
        return self.stack.outputs[name]

    def stop(self) -> None:
        for worker in self._workers:
            worker.stop.set()
        for thread in self._threads:
            if isinstance(thread, Poller):
                thread.stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.functions.stop()
        patches.undo()
        self._server.stop()

    def __enter__(self) -> LocalTwin:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
