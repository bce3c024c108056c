"""The SDK's behaviour against moto in-process and a fake pipeline: both faces, streaming,
admission control, cancel, request ids as idempotency keys, timeouts, closing, GRPO groups.

The fake pipeline keeps the real one's contract: it drains the requests queue and records one
terminal result per request in the executions table (the first write wins), with the
request's content hash. Each request says when the fake finishes it: the tag `delay`, or a
`# delay S` comment in its code (seconds after it was received), else at once; `hold` (or
`# delay hold`) waits for the test to call `finish`. Its reward is the tag `reward`, else 1.0
for code that returns `a + b` and 0.5 for other code; its status the tag `status`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.support.moto import Aws
from trialbox import keys
from trialbox.errors import ClientClosed, RequestIdReused, TrialboxError, WaitTimeout
from trialbox.models import ExecutionRequest, ExecutionResult, Status, Task, result_for
from trialbox.models.sample import TaskRef
from trialbox.pipeline.record import CONTENT_ATTRIBUTE, record
from trialbox.pipeline.stores import ResultTable
from trialbox.sdk import AsyncClient, Client, Handle, Resources, core, request_id
from trialbox.sdk.extract import NO_CODE_FEEDBACK
from trialbox.sdk.tasksets import tasks_body

DELAY = re.compile(r"# delay (\S+)")

pytestmark = pytest.mark.usefixtures("fast_polls")


class FakePipeline:
    """The pipeline as the SDK sees it, on a thread: requests in, terminal results out."""

    def __init__(self, queue_url: str, table: str = "executions", traces: str = "traces") -> None:
        self.queue_url = queue_url
        self.sqs = boto3.client("sqs")
        self.s3 = boto3.client("s3")
        self.table = ResultTable(boto3.client("dynamodb"), table, ttl_days=30)
        self.traces = traces
        self.received: list[str] = []  # every message, in the order received
        self.finished: list[str] = []  # every result written, in order
        self.written: dict[str, bool] = {}  # False: a result existed (first writer wins)
        self.requests: dict[str, ExecutionRequest] = {}
        self.due: dict[str, float | None] = {}  # received, not finished: when (None: held)
        self.max_outstanding = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="fake-pipeline")

    def start(self) -> FakePipeline:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        with self.lock:
            self._drain()  # whatever was sent last is counted

    def _serve(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                self._drain()
                now = time.monotonic()
                due = sorted((at, rid) for rid, at in self.due.items() if at is not None)
                for at, rid in due:
                    if at <= now:
                        self._finish(rid, None)
            time.sleep(0.005)

    def _drain(self) -> None:
        while True:
            answer = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10)
            messages = answer.get("Messages", [])
            if not messages:
                return
            for message in messages:
                request = self._request(message["Body"])
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
                rid = request.request_id
                self.received.append(rid)
                self.requests[rid] = request
                delay = self._delay(request)
                self.due[rid] = None if delay is None else time.monotonic() + delay
            self.max_outstanding = max(self.max_outstanding, len(self.due))

    def _request(self, body: str) -> ExecutionRequest:
        parsed = json.loads(body)
        if "payload_uri" in parsed:
            bucket, _, key = parsed["payload_uri"].removeprefix("s3://").partition("/")
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        return ExecutionRequest.model_validate_json(body)

    @staticmethod
    def _delay(request: ExecutionRequest) -> float | None:
        said = request.tags.get("delay")
        if said is None:
            found = DELAY.search("\n".join(request.files.values()))
            said = found[1] if found else "0"
        return None if said == "hold" else float(said)

    @staticmethod
    def outcome(request: ExecutionRequest) -> ExecutionResult:
        code = "\n".join(request.files.values())
        reward = float(request.tags.get("reward", 1.0 if "return a + b" in code else 0.5))
        task_id = request.task_id
        return result_for(
            request.request_id,
            Status(request.tags.get("status", "succeeded")),
            scored_reward=reward,
            feedback=f"graded {sorted(request.files)} against {request.task_ref}",
            task_id=task_id,
            sample_id=request.sample_id,
        )

    def _finish(self, rid: str, content_sha256: str | None) -> None:
        request = self.requests[rid]
        del self.due[rid]
        self.written[rid] = record(
            self.outcome(request),
            self.table,
            None,
            content_sha256=content_sha256 or request.content_sha256(),
        )
        self.finished.append(rid)

    def wait_received(self, *rids: str, timeout: float = 10) -> None:
        wait_until(lambda: all(rid in self.received for rid in rids), timeout)

    def finish(self, *rids: str, content_sha256: str | None = None) -> None:
        """Finish held requests now, in this order (once each has arrived)."""
        for rid in rids:
            self.wait_received(rid)
            with self.lock:
                self._finish(rid, content_sha256)


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


async def async_wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def req(rid: str, *, delay: str | None = None, **tags: str) -> ExecutionRequest:
    """A request with an inline task; `delay` and the tags steer the fake pipeline."""
    if delay is not None:
        tags["delay"] = delay
    return ExecutionRequest(
        request_id=rid, task=TASK, files={"solution.py": CORRECT}, tags=tags, metadata=None
    )


CORRECT = "def add(a, b):\n    return a + b\n"
TASK = Task.model_validate(
    {
        "task_id": "add-two",
        "prompt": "Write add(a, b) in solution.py",
        "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
        "hidden_tests": {"tests/test_add.py": "from solution import add\n"},
        "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
    }
)


@pytest.fixture
def fake(resources: Resources) -> Iterator[FakePipeline]:
    pipeline = FakePipeline(resources.requests_queue_url).start()
    yield pipeline
    pipeline.stop()


def store(aws: Aws, request: ExecutionRequest) -> None:
    """A terminal result already in the table (an earlier run's)."""
    result = FakePipeline.outcome(request)
    assert record(result, aws.table, None, content_sha256=request.content_sha256())


def stored_status(aws: Aws, rid: str) -> str | None:
    item = aws.item(rid)
    return None if item is None else str(item["status"]["S"])


# --- (a) one implementation, two faces -----------------------------------------------------------


def test_async_and_sync_clients_give_the_same_results(
    resources: Resources, fake: FakePipeline
) -> None:
    def batch(prefix: str) -> list[ExecutionRequest]:
        return [
            req(f"{prefix}0", delay="0.1", reward="1.0"),
            req(f"{prefix}1", reward="0.25"),
            req(f"{prefix}2", status="timeout"),
            req(f"{prefix}3", delay="0.05", status="sandbox_error"),
            req(f"{prefix}4", status="integrity_violation"),
        ]

    async def run_async() -> list[ExecutionResult]:
        async with AsyncClient(resources) as client:
            return await client.run(batch("a"), timeout=10)

    from_async = asyncio.run(run_async())
    with Client(resources) as client:
        from_sync = client.run(batch("s"), timeout=10)

    assert [r.request_id for r in from_async] == [f"a{i}" for i in range(5)]
    assert [r.request_id for r in from_sync] == [f"s{i}" for i in range(5)]
    assert [(r.status, r.reward, r.loss_mask) for r in from_sync] == [
        (Status.SUCCEEDED, 1.0, False),
        (Status.SUCCEEDED, 0.25, False),
        (Status.TIMEOUT, 0.0, False),
        (Status.SANDBOX_ERROR, None, True),
        (Status.INTEGRITY_VIOLATION, 0.0, False),
    ]
    same = {"request_id"}
    assert [r.model_dump(exclude=same) for r in from_async] == [
        r.model_dump(exclude=same) for r in from_sync
    ]
    assert sorted(fake.received) == sorted(r.request_id or "" for r in from_async + from_sync)


# --- (b) streaming -------------------------------------------------------------------------------


def test_as_completed_streams_in_completion_order_and_gather_keeps_submission_order(
    resources: Resources, fake: FakePipeline
) -> None:
    """The fake finishes the held requests in reverse, one at a time: each is yielded as it
    arrives, before the next has a result."""
    ids = ["b0", "b1", "b2", "b3"]
    with Client(resources) as client:
        handles = client.submit([req(rid, delay="hold") for rid in ids])
        stream = client.as_completed(handles, timeout=10)
        order = []
        for rid in reversed(ids):
            fake.finish(rid)
            handle = next(stream)
            assert handle in handles and handle.done()
            assert sum(h.done() for h in handles) == len(order) + 1  # the others still run
            order.append(handle.request_id)
        assert next(stream, None) is None
        assert order == ["b3", "b2", "b1", "b0"]
        assert [r.request_id for r in client.gather(handles, timeout=1)] == ids
        assert [h.result(timeout=1).request_id for h in handles] == ids


def test_async_as_completed_streams_in_completion_order(
    resources: Resources, fake: FakePipeline
) -> None:
    ids = ["c0", "c1", "c2", "c3"]

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncClient(resources) as client:
            handles = await client.submit([req(rid, delay="hold") for rid in ids])
            stream = client.as_completed(handles, timeout=10)
            order = []
            for rid in ["c2", "c0", "c3", "c1"]:
                await asyncio.to_thread(fake.finish, rid)
                handle = await anext(stream)
                assert handle in handles and sum(h.done() for h in handles) == len(order) + 1
                order.append(handle.request_id)
            results = await client.gather(handles, timeout=1)
            return order, [r.request_id or "" for r in results]

    order, gathered = asyncio.run(main())
    assert order == ["c2", "c0", "c3", "c1"]
    assert gathered == ids


def test_as_completed_orders_by_arrival_when_the_pipeline_times_them(
    resources: Resources, fake: FakePipeline
) -> None:
    """Per-request delays, not the test, decide the order: the last submitted is first. The
    client sees results a poll at a time (0.2 s, backing off to 0.675 s within a second of
    quiet), so the delays differ by a second: results one poll takes together have no order."""
    delays = {"d0": "3", "d1": "2", "d2": "1", "d3": "0"}
    with Client(resources) as client:
        handles = client.submit([req(rid, delay=d) for rid, d in delays.items()])
        order = [h.request_id for h in client.as_completed(handles, timeout=10)]
        assert [r.request_id for r in client.gather(handles)] == list(delays)
    assert fake.finished == ["d3", "d2", "d1", "d0"]
    assert order == fake.finished


# --- (c) admission control -----------------------------------------------------------------------


def test_at_most_concurrency_requests_are_in_the_pipeline_at_once(
    resources: Resources, fake: FakePipeline
) -> None:
    requests = [req(f"q{i}", delay=f"{0.01 * (i % 3)}") for i in range(25)]

    async def main() -> list[ExecutionResult]:
        async with AsyncClient(resources, concurrency=4) as client:
            assert client.concurrency == 4
            return await client.run(requests, timeout=20)

    results = asyncio.run(main())
    assert [r.request_id for r in results] == [f"q{i}" for i in range(25)]
    assert all(r.status == Status.SUCCEEDED for r in results)
    assert fake.max_outstanding == 4
    assert sorted(fake.received) == sorted(f"q{i}" for i in range(25))  # each once


def test_the_default_concurrency_is_four_per_pool_worker(resources: Resources) -> None:
    sized = dataclasses.replace(resources, capacity=2)
    fake = FakePipeline(sized.requests_queue_url).start()
    try:
        with Client(sized) as client:
            assert (client.capacity, client.concurrency) == (2, 8)
            results = client.run([req(f"w{i}", delay="0.01") for i in range(30)], timeout=20)
    finally:
        fake.stop()
    assert [r.request_id for r in results] == [f"w{i}" for i in range(30)]
    assert fake.max_outstanding == 8
    assert len(fake.received) == 30


def test_withdraw_stops_sending_and_the_sent_ones_finish(
    resources: Resources, fake: FakePipeline
) -> None:
    """What `trialbox run` does when interrupted: the unsent are withdrawn, the sent drain."""
    requests = [req(f"x{i}", delay="0.05") for i in range(30)]

    async def main() -> tuple[list[str], list[ExecutionResult]]:
        async with AsyncClient(resources, concurrency=5) as client:
            handles = await client.submit(requests)
            async for _ in client.as_completed(handles, timeout=10):
                withdrawn = await client.withdraw(handles)
                break
            return [h.request_id for h in withdrawn], await client.gather(handles, timeout=10)

    withdrawn, results = asyncio.run(main())
    sent = [r.request_id for r in results if r.status == Status.SUCCEEDED]
    # The pump refills a freed slot at once, so a few more than the first 5 may be sent.
    assert 5 <= len(sent) < 30 and sent == [f"x{i}" for i in range(len(sent))]
    assert withdrawn == [f"x{i}" for i in range(len(sent), 30)]
    assert all(r.status == Status.CANCELLED for r in results[len(sent) :])
    fake.stop()
    assert sorted(fake.received) == sorted(sent)


def test_withdraw_returns_the_callers_handles_of_the_unsent(
    resources: Resources, fake: FakePipeline
) -> None:
    with Client(resources, concurrency=2) as client:
        handles = client.submit([req(f"y{i}", delay="hold") for i in range(5)])
        fake.wait_received("y0", "y1")
        withdrawn = client.withdraw(handles)
        assert [h.request_id for h in withdrawn] == ["y2", "y3", "y4"]
        assert all(any(w is h for h in handles) for w in withdrawn)
        assert [h.done() for h in handles] == [False, False, True, True, True]
        fake.finish("y1", "y0")
        statuses = [r.status for r in client.gather(handles, timeout=10)]
        time.sleep(0.3)  # the pump would have sent the withdrawn by now
    assert statuses == [Status.SUCCEEDED] * 2 + [Status.CANCELLED] * 3
    fake.stop()
    assert fake.received == ["y0", "y1"]


# --- (d) cancel ----------------------------------------------------------------------------------


def test_cancelling_an_unsent_request_ends_it_without_sending(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    with Client(resources, concurrency=1) as client:
        first, second = client.submit([req("u0", delay="hold"), req("u1")])
        fake.wait_received("u0")
        assert (first.sent, second.sent) == (True, False)
        client.cancel([second])
        cancelled = second.result(timeout=1)
        assert (cancelled.request_id, cancelled.status) == ("u1", Status.CANCELLED)
        assert (cancelled.reward, cancelled.loss_mask) == (None, True)
        assert cancelled.error == "cancelled by the client"
        fake.finish("u0")
        assert first.result(timeout=10).status == Status.SUCCEEDED
        time.sleep(0.3)  # the pump would have sent u1 by now
    fake.stop()
    assert fake.received == ["u0"]
    assert aws.item("u1") is None  # nothing recorded: it never reached the pipeline


class StopRecorder:
    """Step Functions' StopExecution as the SDK meets it: stops the executions in `running`
    and answers ExecutionDoesNotExist for the others (not started yet, or ended). The
    twin's test stops a real one."""

    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.stopped: list[str] = []

    def stop_execution(self, executionArn: str) -> dict[str, Any]:
        self.stopped.append(executionArn)
        if executionArn.rsplit(":", 1)[1] in self.running:
            return {"stopDate": time.time()}
        error = {"Code": "ExecutionDoesNotExist", "Message": f"{executionArn} does not exist"}
        raise ClientError({"Error": error}, "StopExecution")


ROLLOUT = "arn:aws:states:us-east-1:123456789012:stateMachine:Rollout"


def test_cancelling_an_in_flight_request_records_it_and_stops_its_execution(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    # The stack keeps results 7 days: a cancel's result too (it took 30 from a constant).
    kept = dataclasses.replace(resources, rollout_arn=ROLLOUT, result_ttl_days=7)
    with Client(kept) as client:
        stops = StopRecorder(running={"f0"})
        client.aio._aws.sfn = stops
        running, not_started = client.submit([req("f0", delay="hold"), req("f1", delay="hold")])
        fake.wait_received("f0", "f1")
        client.cancel([running, not_started])  # f1 has no execution yet: the cancel stands
        for handle in (running, not_started):
            result = handle.result(timeout=1)
            assert (result.request_id, result.status) == (handle.request_id, Status.CANCELLED)
            assert (result.reward, result.loss_mask) == (None, True)
        execution = "arn:aws:states:us-east-1:123456789012:execution:Rollout"
        assert sorted(stops.stopped) == [f"{execution}:f0", f"{execution}:f1"]
        for rid in ("f0", "f1"):
            item = aws.item(rid)
            assert item is not None and item["status"]["S"] == "cancelled"
            assert item[CONTENT_ATTRIBUTE]["S"] == req(rid, delay="hold").content_sha256()
            assert json.loads(item["result"]["S"])["error"] == "cancelled by the client"
            assert abs(float(item["expires_at"]["N"]) - (time.time() + 7 * 86400)) < 60
        fake.finish("f0", "f1")  # the pipeline's own results come too late
        assert fake.written == {"f0": False, "f1": False}
        assert stored_status(aws, "f0") == "cancelled"
        assert running.result().status == Status.CANCELLED
        client.cancel([running])  # again: nothing more happens
        assert len(stops.stopped) == 2
    with Client(resources) as later:  # the table keeps it: the same request gets it again
        (again,) = later.submit([req("f0", delay="hold")])
        assert again.done() and again.result().status == Status.CANCELLED
    fake.stop()
    assert fake.received == ["f0", "f1"]


def test_cancelling_a_finished_request_changes_nothing(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    with Client(resources) as client:
        (handle,) = client.submit([req("g0")])
        done = handle.result(timeout=10)
        client.cancel([handle])
        assert handle.result() == done and done.status == Status.SUCCEEDED
    assert stored_status(aws, "g0") == "succeeded"


def test_a_result_recorded_before_the_cancel_stands(
    aws: Aws, resources: Resources, fake: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline recorded the result, the client has not polled it yet, the user cancels:
    the table keeps the pipeline's result, and the handle must give that one too."""
    monkeypatch.setattr(core, "POLL_S", 30)  # no poll between the result and the cancel
    monkeypatch.setattr(core, "MAX_POLL_S", 30)
    with Client(resources) as client:
        (handle,) = client.submit([req("h0", delay="hold")])
        fake.finish("h0")
        client.cancel([handle])
        assert stored_status(aws, "h0") == "succeeded"
        result = handle.result(timeout=5)
        assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)


def test_a_result_recorded_before_a_cancel_right_after_a_poll_is_read_at_once(
    aws: Aws, resources: Resources, fake: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit's wake-up polls no sooner than POLL_S after the last poll; a cancel's polls at
    once, or a result that beat the cancel would wait a whole poll delay."""
    monkeypatch.setattr(core, "POLL_S", 30)
    monkeypatch.setattr(core, "MAX_POLL_S", 30)
    with Client(resources) as client:
        (handle,) = client.submit([req("hp0", delay="hold")])
        fake.wait_received("hp0")
        client.submit([req("hp1", delay="hold")])  # its wake-up polls: hp0 is in flight
        fake.wait_received("hp1")
        fake.finish("hp0")
        client.cancel([handle])
        result = handle.result(timeout=5)
        assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)


# --- (e) request ids are idempotency keys --------------------------------------------------------


def test_the_same_request_submitted_again_runs_once(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    same = req("i0", delay="0.1")
    with Client(resources) as client:
        first, twice = client.submit([same, same])
        (again,) = client.submit([same])  # still open in this client
        results = [h.result(timeout=10) for h in (first, twice, again)]
        assert results[0] == results[1] == results[2]
        (stored,) = client.submit([same])  # now in the table
        assert stored.done() and stored.result() == results[0]
    with Client(resources) as other:
        assert other.run([same], timeout=5) == [results[0]]
    fake.stop()
    assert fake.received == ["i0"]


def test_async_same_request_submitted_again_runs_once(
    resources: Resources, fake: FakePipeline
) -> None:
    same = req("j0", delay="0.1")

    async def main() -> None:
        async with AsyncClient(resources) as client:
            (first,) = await client.submit([same])
            (again,) = await client.submit([same])
            assert again is first
            assert await first.result(timeout=10) == await again.result(timeout=10)

    asyncio.run(main())
    fake.stop()
    assert fake.received == ["j0"]


def test_concurrent_submits_of_one_request_run_it_once(
    resources: Resources, fake: FakePipeline
) -> None:
    """Two coroutines (or two threads of a Client) submit the same request at once: one
    message, and both handles get the result."""
    same = req("k0", delay="0.1")

    async def main() -> list[ExecutionResult]:
        async with AsyncClient(resources) as client:
            (a,), (b,) = await asyncio.gather(client.submit([same]), client.submit([same]))
            return await client.gather([a, b], timeout=5)

    first, second = asyncio.run(main())
    assert first == second and first.status == Status.SUCCEEDED
    fake.stop()
    assert fake.received == ["k0"]


def test_concurrent_submits_of_one_id_with_other_content_raise(
    resources: Resources, fake: FakePipeline
) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(resources) as client:
            outcomes = await asyncio.gather(
                client.submit([req("k1", reward="1.0")]),
                client.submit([req("k1", reward="0.0")]),
                return_exceptions=True,
            )
            sent = [o for o in outcomes if isinstance(o, list)]
            await client.gather([h for handles in sent for h in handles], timeout=5)
            return outcomes

    outcomes = asyncio.run(main())
    assert sum(isinstance(o, RequestIdReused) for o in outcomes) == 1
    fake.stop()
    assert fake.received == ["k1"]


def test_an_id_stored_for_other_content_is_refused_at_submit(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    store(aws, req("l0", reward="1.0"))
    with Client(resources) as client:
        with pytest.raises(RequestIdReused) as raised:
            client.submit([req("l-fresh"), req("l0", reward="0.0")])
        assert raised.value.request_id == "l0"
        assert "request_id 'l0' was already used for a request with different content" in str(
            raised.value
        )
        time.sleep(0.2)
        assert fake.received == []  # nothing of that call, not even the fresh request
        assert client.run([req("l-fresh")], timeout=10)[0].status == Status.SUCCEEDED
        (same,) = client.submit([req("l0", reward="1.0")])
        assert same.done()  # the stored request itself is still taken as it is
    fake.stop()
    assert fake.received == ["l-fresh"]


def test_an_id_open_in_the_client_for_other_content_is_refused_at_submit(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    async def main() -> None:
        async with AsyncClient(resources) as client:
            (open_,) = await client.submit([req("m0", delay="hold")])
            await async_wait_until(lambda: "m0" in fake.received)
            with pytest.raises(RequestIdReused, match="'m0'"):
                await client.submit([req("m-fresh"), req("m0", delay="hold", reward="0")])
            with pytest.raises(RequestIdReused, match="'m1'"):  # twice in one call
                await client.submit([req("m1"), req("m1", reward="0")])
            await asyncio.sleep(0.2)
            assert fake.received == ["m0"]
            await asyncio.to_thread(fake.finish, "m0")
            assert (await open_.result(timeout=10)).status == Status.SUCCEEDED

    asyncio.run(main())
    fake.stop()
    assert fake.received == ["m0"]


def test_a_result_recorded_for_other_content_fails_the_handle(
    resources: Resources, fake: FakePipeline
) -> None:
    """Another client sent other content under this id, and the pipeline ran that one."""
    with Client(resources) as client:
        (handle,) = client.submit([req("n0", delay="hold")])
        fake.finish("n0", content_sha256="0" * 64)
        with pytest.raises(RequestIdReused) as raised:
            handle.result(timeout=10)
        assert raised.value.request_id == "n0"


# --- (f) timeouts --------------------------------------------------------------------------------


def test_waiting_too_long_names_the_requests_without_results(
    resources: Resources, fake: FakePipeline
) -> None:
    with Client(resources) as client:
        handles = client.submit(
            [req("o-slow0", delay="hold"), req("o-fast"), req("o-slow1", delay="hold")]
        )
        handles[1].result(timeout=30)  # a loaded machine may take longer than the 0.3 s below
        with pytest.raises(WaitTimeout) as raised:
            client.gather(handles, timeout=0.3)
        assert raised.value.missing == ["o-slow0", "o-slow1"]
        assert str(raised.value) == (
            "2 request(s) had no terminal result after 0.3 s (first: o-slow0, o-slow1)"
        )
        arrived = []
        with pytest.raises(WaitTimeout) as raised:
            for handle in client.as_completed(handles, timeout=0.3):
                arrived.append(handle.request_id)
        assert arrived == ["o-fast"]
        assert sorted(raised.value.missing) == ["o-slow0", "o-slow1"]
        with pytest.raises(WaitTimeout) as raised:
            handles[2].result(timeout=0.1)
        assert raised.value.missing == ["o-slow1"]
        message = "1 request(s) had no terminal result after 0.1 s (first: o-slow1)"
        assert str(raised.value) == message
        with pytest.raises(WaitTimeout) as raised:
            client.run([req("o-slow0", delay="hold")], timeout=0.2)
        assert raised.value.missing == ["o-slow0"]
        fake.finish("o-slow1", "o-slow0")  # they went on running
        assert [r.status for r in client.gather(handles, timeout=10)] == [Status.SUCCEEDED] * 3


def test_async_waiting_too_long_names_the_requests_without_results(
    resources: Resources, fake: FakePipeline
) -> None:
    async def main() -> None:
        async with AsyncClient(resources) as client:
            handles = await client.submit([req("p-slow", delay="hold"), req("p-fast")])
            await handles[1].result(timeout=30)  # not within 0.3 s on a loaded machine
            with pytest.raises(WaitTimeout) as raised:
                await client.gather(handles, timeout=0.3)
            assert raised.value.missing == ["p-slow"]
            arrived = []
            with pytest.raises(WaitTimeout) as raised:
                async for handle in client.as_completed(handles, timeout=0.3):
                    arrived.append(handle.request_id)
            assert (arrived, raised.value.missing) == (["p-fast"], ["p-slow"])
            with pytest.raises(WaitTimeout) as raised:
                await handles[0].result(timeout=0.1)
            assert raised.value.missing == ["p-slow"]
            with pytest.raises(
                WaitTimeout, match=r"1 request\(s\) .* after 0.2 s \(first: p-slow\)"
            ):
                await client.run([req("p-slow", delay="hold")], timeout=0.2)
            await asyncio.to_thread(fake.finish, "p-slow")
            assert (await handles[0].result(timeout=10)).status == Status.SUCCEEDED

    asyncio.run(main())


# --- (g) closing ---------------------------------------------------------------------------------


def test_closing_the_async_client_fails_its_open_handles(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    async def main() -> None:
        client = AsyncClient(resources, concurrency=1)
        sent, unsent = await client.submit([req("s0", delay="hold"), req("s1")])
        await async_wait_until(lambda: "s0" in fake.received)
        await client.aclose()
        for handle in (sent, unsent):
            with pytest.raises(ClientClosed) as raised:
                await handle.result(timeout=1)
            assert raised.value.request_id == handle.request_id
            assert str(raised.value) == (
                f"the client closed before request {handle.request_id!r} had a result"
            )
        with pytest.raises(TrialboxError, match="the client is closed"):
            await client.submit([req("s2")])

    asyncio.run(main())
    fake.finish("s0")  # a sent request still runs: a new client gets its result
    with Client(resources) as client:
        (handle,) = client.submit([req("s0", delay="hold")])
        assert handle.done() and handle.result().status == Status.SUCCEEDED
    fake.stop()
    assert fake.received == ["s0"]


def test_closing_right_after_a_submit_closes_at_once(
    resources: Resources, fake: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit wakes the pump, then aclose cancels it in the same turn of the loop: the close
    must not wait for the pipeline, nor send what is still waiting."""
    monkeypatch.setattr(core, "POLL_S", 30)  # the pump waits on its wake-up event
    monkeypatch.setattr(core, "MAX_POLL_S", 30)

    async def main() -> None:
        client = AsyncClient(resources, concurrency=1)
        (sent,) = await client.submit([req("sc0", delay="hold")])
        await async_wait_until(lambda: "sc0" in fake.received)
        await asyncio.sleep(0.1)
        (waiting,) = await client.submit([req("sc1", delay="hold")])
        await asyncio.wait_for(client.aclose(), 5)
        for handle in (sent, waiting):
            with pytest.raises(ClientClosed):
                await handle.result(timeout=1)

    asyncio.run(main())
    fake.stop()
    assert fake.received == ["sc0"]


def test_closing_the_sync_client_right_after_a_submit_closes_at_once(
    resources: Resources, fake: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "POLL_S", 30)
    monkeypatch.setattr(core, "MAX_POLL_S", 30)
    client = Client(resources, concurrency=1)
    (sent,) = client.submit([req("sd0", delay="hold")])
    fake.wait_received("sd0")
    time.sleep(0.1)
    (waiting,) = client.submit([req("sd1", delay="hold")])  # wakes the pump
    closing = threading.Thread(target=client.close, daemon=True)
    closing.start()
    closing.join(timeout=5)
    assert not closing.is_alive(), "close() waits for a request that never finishes"
    for handle in (sent, waiting):
        with pytest.raises(ClientClosed):
            handle.result(timeout=1)
    fake.stop()
    assert fake.received == ["sd0"]


def test_submits_one_at_a_time_send_at_once_but_poll_no_faster_than_a_poll_delay(
    resources: Resources, fake: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each submit wakes the pump, which sent and polled: a trainer submitting its samples one
    at a time paid a poll of every request in flight per submit (the twin's orchestration
    benchmark: 2.2 result reads a sample, sent singly). A wake-up sends at once and polls only
    once POLL_S has passed since the last poll."""
    monkeypatch.setattr(core, "POLL_S", 30)
    monkeypatch.setattr(core, "MAX_POLL_S", 30)
    client = Client(resources, concurrency=64)
    polls: list[int] = []
    aws = client._async._aws
    results = aws.results

    def counted(request_ids: list[str]) -> Any:
        polls.append(len(request_ids))
        return results(request_ids)

    monkeypatch.setattr(aws, "results", counted)
    try:
        for n in range(12):
            client.submit([req(f"one-{n}", delay="hold")])
        fake.wait_received("one-11")
        # Each submit reads its own request's stored result (1 id); the pump polled the
        # requests in flight (several ids) once: the first wake-up, none since.
        assert polls.count(1) >= 12 and len(polls) <= 13, polls
    finally:
        client.close()
        fake.stop()


def test_closing_the_client_fails_its_open_handles(
    resources: Resources, fake: FakePipeline
) -> None:
    client = Client(resources, concurrency=1)
    sent, unsent = client.submit([req("t0", delay="hold"), req("t1")])
    fake.wait_received("t0")
    client.close()
    for handle in (sent, unsent):
        with pytest.raises(ClientClosed) as raised:
            handle.result(timeout=1)
        assert raised.value.request_id == handle.request_id
    with pytest.raises(TrialboxError, match="the client is closed"):
        client.submit([req("t2")])
    client.close()  # again: nothing happens
    fake.stop()
    assert fake.received == ["t0"]


def test_closing_the_client_releases_a_thread_waiting_on_a_handle(
    resources: Resources, fake: FakePipeline
) -> None:
    """Another thread blocked in `handle.result()` gets ClientClosed when the client closes.
    (A race: the loop may stop before that thread's wait ends; a few rounds show it.)"""
    for round_ in range(8):
        client = Client(resources)
        rid = f"tw{round_}"
        (handle,) = client.submit([req(rid, delay="hold")])
        fake.wait_received(rid)
        waiter: list[BaseException] = []

        def wait(handle: Handle = handle, waiter: list[BaseException] = waiter) -> None:
            try:
                handle.result(timeout=10)
            except BaseException as exc:  # kept for the assertion
                waiter.append(exc)

        blocked = threading.Thread(target=wait, daemon=True)
        blocked.start()
        time.sleep(0.05)
        client.close()
        blocked.join(timeout=3)
        assert [type(e) for e in waiter] == [ClientClosed], f"round {round_}: still waiting"


# --- (h) GRPO groups -----------------------------------------------------------------------------

COMPLETIONS = [
    "Sure:\n\n```python\ndef add(a, b):\n    return a + b  # delay 0.4\n```\n",
    "```py\ndef add(a, b):\n    return 3\n```",
    "I cannot write code for this one.",
    "Plain fence:\n```\ndef add(a, b):\n    return a + b  # delay 0.2\n```\n",
]


def test_a_group_comes_back_in_input_order(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    with Client(resources) as client:
        results = client.run_group(TASK, COMPLETIONS, group_id="grp", timeout=10)
    ids = [request_id("grp", "add-two", str(i)) for i in range(4)]
    assert [r.request_id for r in results] == ids
    assert fake.finished == [ids[1], ids[3], ids[0]]  # completion order differs
    assert [(r.status, r.reward, r.loss_mask) for r in results] == [
        (Status.SUCCEEDED, 1.0, False),
        (Status.SUCCEEDED, 0.5, False),
        (Status.SUCCEEDED, 0.0, False),
        (Status.SUCCEEDED, 1.0, False),
    ]
    no_code = results[2]
    assert (no_code.flags, no_code.feedback) == (["no_code"], NO_CODE_FEEDBACK)
    assert no_code.feedback == "no code found in the completion"
    assert (no_code.task_id, no_code.sample_id) == ("add-two", "2")
    assert [r.flags for r in results[:2] + results[3:]] == [[], [], []]
    fake.stop()
    assert sorted(fake.received) == sorted([ids[0], ids[1], ids[3]])  # nothing for no code
    assert aws.item(ids[2]) is None
    sent = fake.requests[ids[0]]
    assert sent.files == {"solution.py": "def add(a, b):\n    return a + b  # delay 0.4\n"}
    assert (sent.run_id, sent.sample_id) == ("grp", "0")
    assert fake.requests[ids[3]].files == {
        "solution.py": "def add(a, b):\n    return a + b  # delay 0.2\n"
    }
    ref = TaskRef.parse(str(sent.task_ref))
    assert (ref.taskset, ref.task_id) == ("group-add-two", "add-two")
    body = aws.s3.get_object(Bucket="tasksets", Key=keys.taskset_key(ref.taskset, ref.version))
    assert body["Body"].read() == tasks_body([TASK])


def test_a_group_gives_the_same_results_on_both_faces_and_runs_once(
    resources: Resources, fake: FakePipeline
) -> None:
    async def run_async() -> list[ExecutionResult]:
        async with AsyncClient(resources) as client:
            return await client.run_group(TASK, COMPLETIONS, timeout=10)

    from_async = asyncio.run(run_async())
    with Client(resources) as client:
        from_sync = client.run_group(TASK, COMPLETIONS, timeout=10)  # the same default group id
    assert from_async == from_sync
    assert [r.reward for r in from_sync] == [1.0, 0.5, 0.0, 1.0]
    fake.stop()
    assert len(fake.received) == 3  # the second run found the first's results


# --- (i) a resumed run ---------------------------------------------------------------------------


def test_a_resumed_run_sends_only_what_has_no_result(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    requests = [req(f"v{i}", delay="0.2", reward=str(i / 10)) for i in range(4)]
    for done in (requests[0], requests[2]):
        store(aws, done)
    with Client(resources) as client:
        handles = client.submit(requests)
        assert [h.done() for h in handles] == [True, False, True, False]
        assert [h.sent for h in handles] == [False] * 4 or handles[1].sent
        results = client.gather(handles, timeout=10)
        assert [r.reward for r in results] == [0.0, 0.1, 0.2, 0.3]
        assert [h.latency_s is not None for h in handles] == [False, True, False, True]
    fake.stop()
    assert sorted(fake.received) == ["v1", "v3"]


def test_a_fully_resumed_run_sends_nothing(
    aws: Aws, resources: Resources, fake: FakePipeline
) -> None:
    requests = [req(f"z{i}") for i in range(12)]
    for request in requests:
        store(aws, request)

    async def main() -> list[ExecutionResult]:
        async with AsyncClient(resources) as client:
            handles = await client.submit(requests)
            assert all(h.done() and not h.sent for h in handles)
            return await client.gather(handles, timeout=1)

    assert [r.request_id for r in asyncio.run(main())] == [f"z{i}" for i in range(12)]
    fake.stop()
    assert fake.received == []
