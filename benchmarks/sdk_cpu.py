"""The SDK client's own CPU per 1,000 results, against a bare client measured in the same run.

moto's server runs in one child process and a fake pipeline in another (neither's CPU is
counted): the pipeline long-polls the requests queue, parses each body as an ExecutionRequest
and records a `succeeded` result (reward 1.0, the request's content hash) with the pipeline's
own `record`. This process measures `time.process_time()` (every thread: the SDK's loop and its
to_thread workers; user and system time and context switches reported apart) and wall time of:
1. the SDK: `Client.submit` of N small inline requests, then `as_completed` (and each handle's
   `result()`) to the last one, with `--concurrency` requests in flight;
2. the baseline: the least any client does for the same N results, inline: the SDK's message
   bodies by SendMessageBatch in tens, BatchGetItem of the outstanding ids (100 keys a call)
   every 0.2 s (the SDK's first poll interval), each result parsed into an ExecutionResult,
   with the same in-flight cap.
Building each side's boto3 clients is reported apart (init_*). Every run uses new request ids;
each side runs twice per cap, alternating which goes first (a shared 2-core box is noisy). AWS
calls are counted with botocore's `before-call` event. Figures and ratios only: no timing
asserts. About a minute per cap. Run: `make bench`, or
`.venv/bin/python benchmarks/sdk_cpu.py -n 1000 --concurrency 256 32` (32: the SDK's default
when the pool's size is unknown).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import multiprocessing
import resource
import socket
import threading
import time
import traceback
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3

from trialbox.constants import TABLE_KEY
from trialbox.errors import WaitTimeout
from trialbox.models import ExecutionRequest, ExecutionResult, Status, result_for
from trialbox.pipeline.record import record
from trialbox.pipeline.stores import ResultTable
from trialbox.sdk import Client, Resources, default_concurrency
from trialbox.settings import RESULT_TTL_DAYS

REGION = "us-east-1"
QUEUE = "bench-requests"
TABLE = "bench-executions"
SOLUTION = "def add(a, b):\n    return a + b\n"
POLL_S = 0.2  # the SDK's first poll interval; the baseline polls at this fixed interval
REPEATS = 2
TIMEOUT_S = 300
PIPELINE_THREADS = 4
VISIBILITY_TIMEOUT_S = 10  # a message the fake pipeline failed on comes back


def session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name=REGION
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_moto(port: int) -> None:
    """moto's server, in a process of its own. moto's SQS scans every queued message on each
    call with a datetime-based clock (milliseconds per call with a few hundred queued, enough to
    pace the run); time.time() stands in for it, unchanged in value."""
    import logging

    import moto.sqs.models as sqs
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    slow = sqs.unix_time  # type: ignore[attr-defined]

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else float(slow(dt))

    setattr(sqs, "unix_time", unix_time)  # noqa: B010
    setattr(sqs, "unix_time_millis", lambda dt=None: unix_time(dt) * 1000.0)  # noqa: B010
    cached = functools.cache(sqs.camelcase_to_underscores)  # type: ignore[attr-defined]
    setattr(sqs, "camelcase_to_underscores", cached)  # noqa: B010
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    ThreadedMotoServer("127.0.0.1", port, verbose=False).start()
    threading.Event().wait()


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server in a child process; yields its endpoint."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = multiprocessing.get_context("spawn").Process(target=serve_moto, args=(port,))
    server.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if not server.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.join(timeout=10)


def fake_pipeline(endpoint: str, queue_url: str, stop: Any) -> None:
    """The pipeline's contract, no sandbox: every request -> a `succeeded` result, recorded.
    A few consumers at once, so that moto, not a round trip at a time, sets the pace."""
    with ThreadPoolExecutor(PIPELINE_THREADS) as pool:
        for _ in range(PIPELINE_THREADS):
            pool.submit(consume, endpoint, queue_url, stop)


def consume(endpoint: str, queue_url: str, stop: Any) -> None:
    aws = session()
    sqs = aws.client("sqs", endpoint_url=endpoint)
    table = ResultTable(aws.client("dynamodb", endpoint_url=endpoint), TABLE, RESULT_TTL_DAYS)
    while not stop.is_set():
        try:
            messages = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            for message in messages:
                request = ExecutionRequest.model_validate_json(message["Body"])
                result = result_for(request.request_id, Status.SUCCEEDED, scored_reward=1.0)
                record(result, table, None, content_sha256=request.content_sha256())
            if messages:
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ]
                sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        except Exception:  # the messages come back after the visibility timeout
            traceback.print_exc()


def count_calls(clients: list[Any]) -> Counter[str]:
    calls: Counter[str] = Counter()

    def before_call(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    for client in clients:
        client.meta.events.register("before-call", before_call)
    return calls


def requests_for(prefix: str, n: int) -> list[ExecutionRequest]:
    return [
        ExecutionRequest.model_validate(
            {
                "request_id": f"{prefix}-{i}",
                "task_ref": "bench@v/t",
                "files": {"solution.py": SOLUTION},
            }
        )
        for i in range(n)
    ]


def message_body(request: ExecutionRequest) -> str:
    """What the SDK sends for a small request: ASCII JSON, defaults left out."""
    return json.dumps(request.model_dump(mode="json", exclude_defaults=True))


@dataclass(frozen=True)
class Clock:
    """This process's clocks: every thread's CPU (user and system), wall time, and context
    switches (voluntary: a thread blocked, e.g. one thread handing work to another)."""

    cpu: float
    user: float
    sys: float
    wall: float
    switches: int

    @classmethod
    def now(cls) -> Clock:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(
            time.process_time(),
            usage.ru_utime,
            usage.ru_stime,
            time.perf_counter(),
            usage.ru_nvcsw + usage.ru_nivcsw,
        )


@dataclass
class Measured:
    start: Clock
    ready: Clock  # the boto3 clients built
    end: Clock  # the last result in hand
    results: int
    calls: Counter[str]

    @property
    def cpu_s(self) -> float:
        return self.end.cpu - self.ready.cpu

    @property
    def wall_s(self) -> float:
        return self.end.wall - self.ready.wall

    def report(self) -> dict[str, Any]:
        return {
            "cpu_s": round(self.cpu_s, 3),
            "wall_s": round(self.wall_s, 2),
            "cpu_ms_per_1000_results": round(self.cpu_s * 1e6 / self.results, 1),
            "user_s": round(self.end.user - self.ready.user, 3),
            "sys_s": round(self.end.sys - self.ready.sys, 3),
            "context_switches": self.end.switches - self.ready.switches,
            "results_per_s": round(self.results / self.wall_s, 1),
            "aws_calls": sum(self.calls.values()),
            "aws_calls_by_op": dict(sorted(self.calls.items())),
            "init_cpu_ms": round((self.ready.cpu - self.start.cpu) * 1000, 1),
            "init_wall_ms": round((self.ready.wall - self.start.wall) * 1000, 1),
        }


def sdk_run(
    endpoint: str, resources: Resources, requests: list[ExecutionRequest], concurrency: int
) -> Measured:
    start = Clock.now()
    client = Client(resources, endpoint_url=endpoint, session=session(), concurrency=concurrency)
    aws = client.aio._aws
    calls = count_calls([aws.sqs, aws.dynamodb, aws.s3, aws.sfn])
    ready = Clock.now()
    try:
        handles = client.submit(requests)
        try:
            rewards = [h.result().reward for h in client.as_completed(handles, TIMEOUT_S)]
        except WaitTimeout as exc:
            aio = client.aio  # what the pump is doing, to tell a lost message from a stuck pump
            raise RuntimeError(
                f"{exc}; pump {aio._pump!r}, {len(aio._waiting)} waiting, "
                f"{len(aio._in_flight)} in flight"
            ) from exc
        end = Clock.now()
    finally:
        client.close()
    assert len(rewards) == len(requests) and all(r == 1.0 for r in rewards), rewards[:3]
    return Measured(start, ready, end, len(rewards), calls)


def baseline_run(
    endpoint: str, resources: Resources, requests: list[ExecutionRequest], concurrency: int
) -> Measured:
    start = Clock.now()
    aws = session()
    sqs = aws.client("sqs", endpoint_url=endpoint)
    dynamodb = aws.client("dynamodb", endpoint_url=endpoint)
    calls = count_calls([sqs, dynamodb])
    queue_url, table = resources.requests_queue_url, resources.executions_table
    ready = Clock.now()

    waiting = deque(requests)
    outstanding: dict[str, None] = {}  # sent, no result yet (insertion-ordered)
    results: dict[str, ExecutionResult] = {}
    while waiting or outstanding:
        room = min(concurrency - len(outstanding), len(waiting))
        batch = [waiting.popleft() for _ in range(room)]
        for first in range(0, len(batch), 10):
            chunk = batch[first : first + 10]
            entries = [{"Id": str(i), "MessageBody": message_body(r)} for i, r in enumerate(chunk)]
            answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            assert not answer.get("Failed"), answer["Failed"]
            outstanding.update(dict.fromkeys(r.request_id for r in chunk))
        time.sleep(POLL_S)
        ids = list(outstanding)
        for first in range(0, len(ids), 100):
            keys = [{TABLE_KEY: {"S": rid}} for rid in ids[first : first + 100]]
            while keys:
                answer = dynamodb.batch_get_item(
                    RequestItems={table: {"Keys": keys, "ConsistentRead": True}}
                )
                for item in answer["Responses"].get(table, []):
                    rid = item[TABLE_KEY]["S"]
                    results[rid] = ExecutionResult.model_validate_json(item["result"]["S"])
                    del outstanding[rid]
                keys = answer.get("UnprocessedKeys", {}).get(table, {}).get("Keys", [])
    end = Clock.now()
    assert len(results) == len(requests) and all(r.reward == 1.0 for r in results.values())
    return Measured(start, ready, end, len(results), calls)


Run = Callable[[str, Resources, list[ExecutionRequest], int], Measured]
SIDES: dict[str, Run] = {"sdk": sdk_run, "baseline": baseline_run}


def create_resources(endpoint: str) -> Resources:
    aws = session()
    sqs = aws.client("sqs", endpoint_url=endpoint)
    queue_url = sqs.create_queue(
        QueueName=QUEUE, Attributes={"VisibilityTimeout": str(VISIBILITY_TIMEOUT_S)}
    )["QueueUrl"]
    aws.client("dynamodb", endpoint_url=endpoint).create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": TABLE_KEY, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": TABLE_KEY, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return Resources(
        requests_queue_url=queue_url,
        executions_table=TABLE,
        traces_bucket="bench-traces",
        tasksets_bucket="bench-tasksets",
    )


@contextmanager
def pipeline(endpoint: str, queue_url: str) -> Iterator[None]:
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    process = spawn.Process(target=fake_pipeline, args=(endpoint, queue_url, stop))
    process.start()
    try:
        yield
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()


def compare(endpoint: str, resources: Resources, n: int, concurrency: int) -> dict[str, Any]:
    """Each side REPEATS times, alternating which goes first; new request ids every run."""
    runs: dict[str, list[Measured]] = {name: [] for name in SIDES}
    for repeat in range(REPEATS):
        for name in list(SIDES)[:: 1 if repeat % 2 == 0 else -1]:
            requests = requests_for(f"{name}-c{concurrency}-r{repeat}", n)
            gc.collect()  # the last run's garbage is not this run's cost
            runs[name].append(SIDES[name](endpoint, resources, requests, concurrency))
    pairs = list(zip(runs["sdk"], runs["baseline"], strict=True))
    return {
        **{name: [m.report() for m in measured] for name, measured in runs.items()},
        "sdk_over_baseline_cpu": [round(s.cpu_s / b.cpu_s, 2) for s, b in pairs],
        "sdk_over_baseline_wall": [round(s.wall_s / b.wall_s, 2) for s, b in pairs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="requests per run")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[256],
        help="in-flight caps, each measured in turn (the SDK's default for an unknown pool is "
        f"{default_concurrency(None)}; each cap adds about a minute)",
    )
    args = parser.parse_args()

    report: dict[str, Any] = {"results_per_run": args.n, "repeats": REPEATS}
    with moto_server() as endpoint:
        resources = create_resources(endpoint)
        with pipeline(endpoint, resources.requests_queue_url):
            for name, run in SIDES.items():  # warm: first imports, first calls
                run(endpoint, resources, requests_for(f"warm-{name}", 20), 20)
            for concurrency in args.concurrency:
                report[f"concurrency_{concurrency}"] = compare(
                    endpoint, resources, args.n, concurrency
                )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
