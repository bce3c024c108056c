"""The twin's AWS side, in a process of its own: moto in server mode with state machines
executing, the stack's resources and state machines from the synthesized template, the
function processes, the event-source pollers and the schedules. The pool workers stay with
the caller, so moto's interpreter and the workers do not share one interpreter lock, as on
AWS they share nothing.

Run as `python -m trialbox.local.services PORT HEARTBEAT_S LOG_DIR`: it prints one JSON line
(`{"port": ..., "outputs": {...}, "task": {...}}`) when ready and serves until its stdin
closes, then exits at once, so it never outlives the caller. It is in its own session: a
terminal's Ctrl-C goes to the caller, which decides what happens to the jobs in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import boto3
import requests
from moto.server import ThreadedMotoServer

from trialbox import aws_retries
from trialbox import constants as c
from trialbox.errors import TrialboxError
from trialbox.local import (
    faults,
    limit_patches,
    models_cache,
    patches,
    principals,
    requestlog,
)
from trialbox.local.function_urls import FunctionUrl
from trialbox.local.functions import FunctionHost
from trialbox.local.poller import Poller, Scheduler
from trialbox.local.resources import REGION, create
from trialbox.local.template import load_template

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": principals.SDK,
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": REGION,
}
# An elastic twin's scaler settings (JSON: variable -> value), over the template's: its pool's
# bounds, and a tick and idle time of seconds (trialbox.local.twin).
ENV_SCALER_OVERRIDES = "TRIALBOX_TWIN_SCALER_ENV"
SCALER_HANDLER = "functions.scaler.handler.handler"
MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}


# One session for every client a process makes here: each client names its own credentials,
# and a session parses botocore's endpoint and service data once (a new session per client
# parsed them again for each of a twin's dozen clients: a fifth of its services' start). A
# session is not thread-safe, its clients are: one client is made at a time.
_SESSION_LOCK = threading.Lock()


@functools.cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()


def client(endpoint_url: str, service: str, key: str = principals.SDK) -> Any:
    """A client of the twin, signing as `key` (the principal it stands for)."""
    with _SESSION_LOCK:
        return _session().client(
            service,
            endpoint_url=endpoint_url,
            region_name=REGION,
            aws_access_key_id=key,
            aws_secret_access_key="local",
            config=aws_retries.config(),  # the event-source pollers retry as Lambda's do
        )


def serve(port: int, heartbeat_s: int, log_dir: Path, ready: IO[str], until: IO[str]) -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    models_cache.share()  # moto's backends and the twin's clients: each model parsed once
    patches.keep_connections_alive()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    faults.install_from_env(server)  # inside the request log, which then records the faults
    if os.environ.get(requestlog.ENV_REQUEST_LOG):
        requestlog.install(server, os.environ[requestlog.ENV_REQUEST_LOG])
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["MOTO_PORT"] = str(port)  # moto's interpreter calls services there
    requests.post(f"{endpoint}/moto-api/config", json=MOTO_CONFIG, timeout=10)
    # An ECS task stays RUNNING until the pool stops it (moto would move it on a step per
    # DescribeTasks, so that a client asking about a live worker would see it stop).
    frozen: dict[str, Any] = {
        "model_name": "ecs::task",
        "transition": {"progression": "manual", "times": 10**9},
    }
    requests.post(f"{endpoint}/moto-api/state-manager/set-transition", json=frozen, timeout=10)
    services = ("s3", "sqs", "dynamodb", "stepfunctions", "ecs")
    clients = {s: client(endpoint, s, principals.SETUP) for s in services}
    urls: dict[str, FunctionUrl] = {}

    def function_url(function: str) -> str:
        urls[function] = FunctionUrl(function)
        return urls[function].url

    stack = create(load_template(), clients, function_url)
    env = CREDENTIALS | {
        "AWS_ENDPOINT_URL": endpoint,
        "POWERTOOLS_TRACE_DISABLED": "true",
        c.ENV_HEARTBEAT_S: str(heartbeat_s),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    overrides = json.loads(os.environ.get(ENV_SCALER_OVERRIDES) or "{}")
    for name, spec in stack.functions.items():
        if spec.handler == SCALER_HANDLER:
            environment = spec.environment | overrides
            stack.functions[name] = dataclasses.replace(spec, environment=environment)
    functions = FunctionHost(stack.functions, env, log_dir)
    functions.start()
    patches.route_lambda_invocations(functions.invoke)
    for url in urls.values():
        url.start(functools.partial(functions.invoke, throttle=True))
    patches.keep_early_callbacks()
    patches.accept_early_heartbeats()
    patches.keep_failure_causes()
    patches.new_token_per_attempt()
    patches.reuse_service_clients()
    patches.parse_each_definition_once()
    patches.parse_each_json_path_once()
    patches.route_each_host_once()
    patches.find_each_action_by_a_set()
    patches.parse_headers_directly()
    patches.isolate_dynamodb_transactions()
    patches.read_the_sqs_clock_directly()
    limit_patches.enforce()  # AWS's limits, after route_lambda_invocations (docs/twin-fidelity.md)
    # Lambda polls a mapping's queue with the function's own role, with as many invocations
    # at once as its scaling allows: here, as the function's processes (FunctionHost.most).
    pollers = [
        Poller(client(endpoint, "sqs", principals.function(m.function)), m, functions.invoke)
        for m in stack.mappings
        for _ in range(functions.concurrency(m.function, m.max_concurrency))
    ]
    for poller in pollers:
        poller.start()
    for schedule in stack.schedules:
        Scheduler(schedule, functions.invoke).start()
    try:
        answer = {
            "port": port,
            "outputs": stack.outputs,
            "task": stack.task_definition,
            "service": stack.service,
        }
        ready.write(json.dumps(answer) + "\n")
        ready.flush()
    except BrokenPipeError:  # the caller stopped or died while we started
        return
    until.read()  # EOF: the caller stopped or died


class ServicesProcess:
    """The caller's handle on the services process."""

    def __init__(
        self, port: int, heartbeat_s: int, log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        """`env`: added to the process's environment (fault injection's settings)."""
        self.port = port
        self.heartbeat_s = heartbeat_s
        self.log_dir = log_dir
        self.env = env or {}
        self.outputs: dict[str, str] = {}
        self.task_definition: dict[str, Any] = {}  # the pool's: family, memory_mb
        self.service = ""  # the pool's ECS service (its ARN)
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / "services.log"
        argv = [sys.executable, "-m", "trialbox.local.services", str(self.port)]
        argv += [str(self.heartbeat_s), str(self.log_dir)]
        with log.open("w") as stderr:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
                env=os.environ | self.env,
            )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # blocks until ready, or EOF if it died
        if not line:
            self.stop()
            tail = log.read_text(errors="replace")[-2000:]
            raise TrialboxError(f"the local twin's services did not start:\n{tail}")
        ready = json.loads(line)
        self.port, self.outputs = ready["port"], ready["outputs"]
        self.task_definition = ready["task"]
        self.service = ready["service"]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str]) -> None:
    ready = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a stray print goes to the log, never into the pipe nobody reads
    log_dir = Path(argv[2])
    serve(int(argv[0]), int(argv[1]), log_dir, ready, sys.stdin)
    # Everything here is in memory and goes with the process: no graceful teardown to wait
    # for. The function processes see their stdin close and exit. The logs go too, and the
    # caller's directory with them once empty, even when the caller was killed outright.
    logging.shutdown()
    shutil.rmtree(log_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        log_dir.parent.rmdir()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
