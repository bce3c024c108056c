"""Red-team checks of the SDK against moto in-process: hostile inputs and careless trainers.

Each test pins behaviour that is correct today: every accepted request ends with exactly one
terminal result (or an error on its handle, never a hang), every refused one says why, and no
submission is silently changed on its way. The fake pipeline here runs the real Dispatcher
(so the content hash the result carries is the one the pipeline computes from the message it
received, inline or by S3 pointer) and records a `succeeded` result for each request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from tests.support.moto import Aws
from trialbox import constants as c
from trialbox import keys, runs
from trialbox.constants import MAX_INLINE_REQUEST_BYTES as MAX_INLINE_BYTES
from trialbox.errors import (
    ClientClosed,
    InputError,
    RequestIdReused,
    SessionError,
    TrialboxError,
    WaitTimeout,
)
from trialbox.models import ExecutionRequest, Status, Task, result_for
from trialbox.models.jobs import RolloutInput
from trialbox.models.sessions import SessionOpen
from trialbox.pipeline.dispatch import Dispatcher
from trialbox.pipeline.record import record
from trialbox.sdk import AsyncClient, Client, Resources, sessions
from trialbox.sdk.extract import extract_code
from trialbox.sqs_batch import MAX_BATCH_BYTES

ROLLOUT_ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:Rollout"
TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks.jsonl"
TASK = Task.model_validate(
    {
        "task_id": "add-two",
        "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
        "hidden_tests": {"tests/test_add.py": "from solution import add\n"},
        "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
    }
)

pytestmark = pytest.mark.usefixtures("fast_polls")


class StubStepFunctions:
    """Step Functions as the Dispatcher calls it: a started execution runs at once, recording
    a `succeeded` result with the content hash the Dispatcher put in its input."""

    class exceptions:
        class ExecutionAlreadyExists(Exception):
            pass

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.started: dict[str, RolloutInput] = {}

    def start_execution(self, stateMachineArn: str, name: str, input: str) -> dict[str, Any]:
        if name in self.started:
            raise self.exceptions.ExecutionAlreadyExists()
        rollout = RolloutInput.model_validate_json(input)
        self.started[name] = rollout
        self.pipeline.execute(rollout)
        return {}

    def describe_execution(self, executionArn: str) -> dict[str, Any]:
        return {"input": self.started[executionArn.rsplit(":", 1)[1]].model_dump_json()}


class Pipeline:
    """The requests queue drained on a thread through the real Dispatcher."""

    def __init__(self, aws: Aws, queue_url: str) -> None:
        self.aws, self.queue_url = aws, queue_url
        self.sfn = StubStepFunctions(self)
        self.dead_letters: list[tuple[str, str]] = []
        self.dispatcher = Dispatcher(
            self.sfn,
            ROLLOUT_ARN,
            aws.table,
            aws.traces,
            lambda b, r: self.dead_letters.append((b, r)),
            aws.admission,
            lambda body: aws.sqs.send_message(QueueUrl=queue_url, MessageBody=body),
        )
        self.ran: list[ExecutionRequest] = []
        self.paused = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="redteam-pipeline")

    def execute(self, rollout: RolloutInput) -> None:
        request = rollout.request
        if request is None:
            assert rollout.payload_uri is not None
            request = ExecutionRequest.model_validate_json(
                self.aws.traces.get_bytes(rollout.payload_uri)
            )
        self.ran.append(request)
        result = result_for(
            request.request_id, Status.SUCCEEDED, scored_reward=1.0, sample_id=request.sample_id
        )
        record(result, self.aws.table, None, content_sha256=rollout.content_sha256)

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if self.paused.is_set():
                time.sleep(0.01)
                continue
            answer = self.aws.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10)
            for message in answer.get("Messages", []):
                self.dispatcher(message["Body"])
                self.aws.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
            if not answer.get("Messages"):
                time.sleep(0.01)

    @property
    def ran_ids(self) -> list[str]:
        return [r.request_id for r in self.ran]

    def queued(self) -> int:
        attributes = self.aws.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


@pytest.fixture
def pipeline(aws: Aws, resources: Resources) -> Iterator[Pipeline]:
    fake = Pipeline(aws, resources.requests_queue_url)
    fake.thread.start()
    yield fake
    fake.stopping.set()
    fake.thread.join(timeout=10)


def req(rid: str, **fields: Any) -> ExecutionRequest:
    fields.setdefault("task_ref", "t@v/add-two")
    return ExecutionRequest(request_id=rid, **fields)


def wait_until(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


class RecordingSqs:
    """The real (moto) SQS client, keeping each SendMessageBatch call's entries."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        self.calls: list[list[dict[str, str]]] = []

    def send_message_batch(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs["Entries"])
        return self.sqs.send_message_batch(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sqs, name)


class CountingDynamoDB:
    """The real (moto) DynamoDB client, counting BatchGetItem calls and failing the next
    `failing` of them with a throttling error."""

    def __init__(self, dynamodb: Any, failing: int = 0) -> None:
        self.dynamodb, self.failing, self.calls = dynamodb, failing, 0

    def batch_get_item(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failing > 0:
            self.failing -= 1
            error = {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}
            raise ClientError({"Error": error}, "BatchGetItem")
        return self.dynamodb.batch_get_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dynamodb, name)


def body(request: ExecutionRequest) -> str:
    """The inline message body as the SDK sends it: ASCII JSON (SQS refuses some characters
    that JSON escapes carry)."""
    return json.dumps(request.model_dump(mode="json", exclude_defaults=True))


def sized(rid: str, total_bytes: int) -> ExecutionRequest:
    """A request whose inline message body is exactly `total_bytes` bytes, made of non-ASCII
    characters (six bytes each, escaped): the 128 KiB boundary counts the body's bytes."""
    base = len(body(req(rid, files={"a.py": ""})).encode())
    sixes, ones = divmod(total_bytes - base, 6)
    request = req(rid, files={"a.py": "€" * sixes + "x" * ones})
    assert len(body(request).encode()) == total_bytes
    return request


# --- request ids ----------------------------------------------------------------------------------


def test_a_request_id_at_the_80_character_limit_runs_and_81_is_refused_in_words() -> None:
    assert req("a" * 80).request_id == "a" * 80
    for bad in ("a" * 81, "", "has space", "slash/es", "ünicode", "dot.ted", "nul\x00"):
        with pytest.raises(ValidationError, match="request_id must be 1 to 80 characters"):
            req(bad)


def test_the_same_id_twice_in_one_submit_shares_one_handle_and_runs_once(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    with Client(resources) as client:
        first, again, other = client.submit([req("dup"), req("dup"), req("other")])
        assert first._inner is again._inner
        assert client.gather([first, again, first, other], timeout=10)[:3] == [first.result()] * 3
    assert sorted(pipeline.ran_ids) == ["dup", "other"]


def test_the_same_id_with_other_content_in_one_submit_is_refused_and_nothing_is_sent(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    with Client(resources) as client:
        with pytest.raises(RequestIdReused, match=r"'dup'.*give the new request a new id"):
            client.submit([req("ok"), req("dup"), req("dup", files={"a.py": "x"})])
        time.sleep(0.2)
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


# --- sizes ----------------------------------------------------------------------------------------


def test_the_inline_limit_counts_body_bytes_and_a_pointer_is_read_back_as_sent(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    at_limit = sized("at-limit", MAX_INLINE_BYTES)
    over = sized("over", MAX_INLINE_BYTES + 1)
    recording = RecordingSqs(aws.sqs)
    with Client(resources) as client:
        client.aio._aws.sqs = recording
        results = client.run([at_limit, over], timeout=20)
    assert [(r.request_id, r.status) for r in results] == [
        ("at-limit", Status.SUCCEEDED),
        ("over", Status.SUCCEEDED),
    ]  # the pipeline's hash of what it received agreed with the SDK's: no RequestIdReused
    bodies = {
        json.loads(e["MessageBody"])["request_id"]: e["MessageBody"]
        for call in recording.calls
        for e in call
    }
    assert len(bodies["at-limit"].encode()) == MAX_INLINE_BYTES
    key = keys.payload_key(over.content_sha256())
    assert json.loads(bodies["over"]) == {"request_id": "over", "payload_uri": f"s3://traces/{key}"}
    assert {r.request_id: r for r in pipeline.ran}["over"] == over


def test_two_bodies_of_exactly_128_kib_share_one_batch_at_exactly_256_kib(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    requests = [sized(f"half{i}", MAX_INLINE_BYTES) for i in range(3)]
    recording = RecordingSqs(aws.sqs)
    with Client(resources) as client:
        client.aio._aws.sqs = recording
        assert {r.status for r in client.run(requests, timeout=20)} == {Status.SUCCEEDED}
    sizes = [sum(len(e["MessageBody"].encode()) for e in call) for call in recording.calls]
    assert sizes == [MAX_BATCH_BYTES, MAX_INLINE_BYTES]


def test_metadata_that_json_cannot_hold_exactly_still_hashes_the_same_on_both_sides(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    """NaN and infinities become null, tuples lists, nested int keys strings: the pipeline's
    hash of the received request must still equal the SDK's, or the result would come back
    as RequestIdReused."""
    odd = {
        "logprob": float("-inf"),
        "nan": float("nan"),
        "nested": {1: (1, 2), "b": {2.5: None}},
        "big": 2**80,
        "set": {"x"},
    }
    request = req("odd-meta", metadata=odd, files={"a.py": "x = '\x00\ufffd\u2028'"})
    with Client(resources) as client:
        (result,) = client.run([request], timeout=10)
    assert result.status == Status.SUCCEEDED


# --- waiting --------------------------------------------------------------------------------------


def test_zero_negative_and_empty_waits(aws: Aws, resources: Resources, pipeline: Pipeline) -> None:
    pipeline.paused.set()
    with Client(resources) as client:
        assert list(client.as_completed([])) == []
        assert client.gather([]) == []
        assert client.gather([], timeout=-1) == []
        (held,) = client.submit([req("held")])
        for timeout in (0, -5):
            with pytest.raises(WaitTimeout) as raised:
                held.result(timeout=timeout)
            assert raised.value.missing == ["held"]
            with pytest.raises(WaitTimeout):
                client.gather([held], timeout=timeout)
            with pytest.raises(WaitTimeout):
                list(client.as_completed([held], timeout=timeout))
        pipeline.paused.clear()
        done = held.result(timeout=10)
        assert held.result(timeout=0) == done == client.gather([held, held], timeout=0)[1]
        assert [h.request_id for h in client.as_completed([held, held], timeout=1)] == ["held"]


def test_async_zero_negative_and_empty_waits(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    async def main() -> None:
        async with AsyncClient(resources) as client:
            assert [h async for h in client.as_completed([])] == []
            assert await client.gather([], timeout=0) == []
            (handle,) = await client.submit([req("async-held")])
            await handle.result(timeout=10)
            for timeout in (0, -1):  # done already: no wait needed
                assert [h async for h in client.as_completed([handle, handle], timeout)] == [handle]
                assert (await client.gather([handle], timeout))[0].status == Status.SUCCEEDED

    asyncio.run(main())


def test_closing_while_another_thread_streams_ends_its_iteration(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    pipeline.paused.set()
    client = Client(resources, concurrency=1)
    handles = client.submit([req(f"c{i}") for i in range(3)])
    seen: list[tuple[str, type]] = []

    def stream() -> None:
        for handle in client.as_completed(handles, timeout=10):
            try:
                handle.result()
            except ClientClosed as exc:
                seen.append((handle.request_id, type(exc)))

    streaming = threading.Thread(target=stream)
    streaming.start()
    time.sleep(0.2)
    client.close()
    streaming.join(timeout=10)
    assert not streaming.is_alive()
    assert sorted(seen) == [(f"c{i}", ClientClosed) for i in range(3)]


def test_a_blocking_client_works_inside_a_running_event_loop(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    async def trainer() -> list[Status]:
        with Client(resources) as client:  # blocks this loop, never deadlocks it
            return [r.status for r in client.run([req("in-loop")], timeout=10)]

    assert asyncio.run(trainer()) == [Status.SUCCEEDED]


def test_ctrl_c_during_gather_leaves_the_client_usable(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    pipeline.paused.set()
    with Client(resources) as client:
        handles = client.submit([req("k0"), req("k1")])
        main = threading.main_thread().ident
        assert main is not None and threading.get_ident() == main
        timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))  # a real Ctrl-C
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            client.gather(handles, timeout=10)
        assert time.monotonic() - started < 5  # the wait was interrupted, not timed out
        timer.join()
        pipeline.paused.clear()
        assert [r.status for r in client.gather(handles, timeout=10)] == [Status.SUCCEEDED] * 2


# --- failures inside the client end in errors, never in a hang ------------------------------------


def test_transient_throttling_of_polls_is_ridden_out(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    with Client(resources) as client:
        counting = CountingDynamoDB(client.aio._aws.dynamodb)
        client.aio._aws.dynamodb = counting
        handles = client.submit([req("t0"), req("t1")])  # the submit check reads the table once
        counting.failing = 2
        assert [r.status for r in client.gather(handles, timeout=10)] == [Status.SUCCEEDED] * 2


def put_result_item(aws: Aws, rid: str, body: str) -> None:
    aws.dynamodb.put_item(
        TableName="executions", Item={c.TABLE_KEY: {"S": rid}, "result": {"S": body}}
    )


def test_a_result_from_a_newer_stack_with_an_unknown_field_is_read(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    pipeline.paused.set()
    with Client(resources) as client:
        (handle,) = client.submit([req("newer")])
        wait_until(lambda: handle.sent)
        newer = json.loads(
            result_for("newer", Status.SUCCEEDED, scored_reward=0.5).model_dump_json()
        )
        put_result_item(aws, "newer", json.dumps(newer | {"field_from_a_newer_stack": 1}))
        result = handle.result(timeout=10)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 0.5)


def test_a_corrupt_result_item_ends_the_wait_instead_of_hanging(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    pipeline.paused.set()
    with Client(resources) as client:
        handles = client.submit([req("corrupt"), req("fine")])
        wait_until(lambda: all(h.sent for h in handles))
        put_result_item(aws, "corrupt", '{"status": "succeeded", "rew')  # cut short
        pipeline.paused.clear()
        for handle in client.as_completed(handles, timeout=10):  # no WaitTimeout: none hangs
            assert handle.done()
        with pytest.raises(TrialboxError):
            handles[0].result()


def test_a_request_that_is_not_valid_unicode_is_refused_where_it_is_built(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    """A lone surrogate (half of a UTF-16 pair, as a JSON "\\ud83d" decodes) is a valid
    Python str but not valid Unicode text: refused with the field, never sent."""
    for fields in (
        {"files": {"a.py": "x = '\ud83d'"}},
        {"commands": [["echo", "\ud83d"]]},
        {"metadata": {"note": "\ud83d"}},
    ):
        with pytest.raises(ValidationError, match="is not valid Unicode text"):
            req("half-emoji", **fields)
    with Client(resources) as client:
        assert [r.status for r in client.run([req("later")], timeout=10)] == [Status.SUCCEEDED]
    assert "half-emoji" not in pipeline.ran_ids


def test_a_submit_of_two_thousand_requests_is_quick_and_reads_the_table_in_batches_of_100(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    pipeline.paused.set()
    with Client(resources, concurrency=4) as client:
        counting = CountingDynamoDB(client.aio._aws.dynamodb)
        client.aio._aws.dynamodb = counting
        requests = [req(f"n{i}", files={"a.py": f"x = {i}"}) for i in range(2000)]
        started = time.monotonic()
        handles = client.submit(requests)
        assert time.monotonic() - started < 10
        assert counting.calls == 20
        wait_until(lambda: sum(h.sent for h in handles) == 4)
        started = time.monotonic()
        withdrawn = client.withdraw(handles)
        assert time.monotonic() - started < 2  # no AWS call for what was never sent
        assert len(withdrawn) == 1996
        assert all(r.status == Status.CANCELLED for r in client.gather(withdrawn, timeout=1))
        pipeline.paused.clear()
        sent = [h for h in handles if h.sent]
        assert [r.status for r in client.gather(sent, timeout=10)] == [Status.SUCCEEDED] * 4
    assert sorted(pipeline.ran_ids) == sorted(h.request_id for h in sent)


# --- GRPO groups ----------------------------------------------------------------------------------


def test_a_group_of_hostile_completions_extracts_and_grades_each(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    big = "x = 1\n" * 40_000  # 240 KB of code: its request travels by S3 pointer
    completions = [
        "```python\nprint('a\x00b')\n```",  # NUL: the parser makes it U+FFFD
        f"```python\n{big}```",
        "```py\nfirst\n```\n" * 1000 + "```python\nlast = 1\n```\n" + "```bash\nls\n```\n",
        "`" * 100_000,  # backticks, no fence
        "```python\n" + "y = 2\n",  # cut off at max tokens: runs to the end
        "",
    ]
    with Client(resources) as client:
        results = client.run_group(TASK, completions, group_id="hostile", timeout=20)
    assert [(r.status, r.flags) for r in results] == [
        (Status.SUCCEEDED, []),
        (Status.SUCCEEDED, []),
        (Status.SUCCEEDED, []),
        (Status.SUCCEEDED, ["no_code"]),
        (Status.SUCCEEDED, []),
        (Status.SUCCEEDED, ["no_code"]),
    ]
    files = {r.sample_id: r.files["solution.py"] for r in pipeline.ran}
    assert files == {
        "0": "print('a\ufffdb')\n",
        "1": big,
        "2": "last = 1\n",
        "4": "y = 2\n",
    }
    assert extract_code(completions[2]) == "last = 1\n"


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (3, "returned a int: it must return the code"),
        (["a.py"], "returned a list"),
        ({"a.py": b"x"}, "code of type bytes for 'a.py'"),
        ({1: "x"}, "a path 1 of type int"),
    ],
)
def test_an_extractor_returning_the_wrong_type_is_refused_before_anything_is_sent(
    aws: Aws, resources: Resources, pipeline: Pipeline, returned: Any, message: str
) -> None:
    with Client(resources) as client, pytest.raises(InputError, match=message):
        client.run_group(TASK, ["```\nx\n```"], extract=lambda _: returned, timeout=5)
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


def test_an_extractor_that_raises_sends_nothing_of_the_group(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    def extract(completion: str) -> str:
        if completion == "two":
            raise KeyError("extractor bug")
        return "x = 1\n"

    with Client(resources) as client, pytest.raises(KeyError, match="extractor bug"):
        client.run_group(TASK, ["one", "two", "three"], extract=extract, timeout=5)
    time.sleep(0.1)
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


def test_a_trainers_timeout_cancels_the_late_sample_alone_and_keeps_the_groups_results(
    aws: Aws, resources: Resources, pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: TrialboxReward(timeout=T) waited for the whole group, and one sample still
    running at T (a policy's `while True`) made every reward of its group None, the finished
    ones too: the policy masked its own group. Now the late sample is cancelled (None) and
    the results that arrived stand; `mask_failed_groups` still masks its group."""
    from trialbox.integrations.trl import TrialboxReward

    real = Pipeline.execute

    def execute(self: Pipeline, rollout: RolloutInput) -> None:
        if "while True" not in str(rollout.request and rollout.request.files):
            real(self, rollout)  # the other is still running when the trainer's time is up

    monkeypatch.setattr(Pipeline, "execute", execute)
    fast = "```python\ndef add(a, b):\n    return a + b\n```"
    spins = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    completions = [fast, "no code", spins]
    with Client(resources) as client:
        reward = TrialboxReward(client, task_column="task", timeout=1)
        started = time.monotonic()
        assert reward(prompts=["p"] * 3, completions=completions, task=[TASK_JSON] * 3) == [
            1.0,
            0.0,
            None,
        ]
        assert time.monotonic() - started < 5
        masked = TrialboxReward(client, task_column="task", timeout=1, mask_failed_groups=True)
        assert (
            masked(prompts=["q"] * 3, completions=completions, task=[TASK_JSON] * 3) == [None] * 3
        )


# --- a task as a Task, a ref, or its JSON ------------------------------------------------------
# --- a task as a Task, a ref, or its JSON ------------------------------------------------------

TASK_JSON = TASK.model_dump(mode="json")
BAD_TASK = TASK_JSON | {"grading": TASK_JSON["grading"] | {"scorer": "magic"}}  # a row's typo


def test_every_entry_point_takes_a_task_as_its_json_like_the_task_itself(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    """Was a break: `'dict' object has no attribute 'task_id'` (run_group, resolve_task) and
    `'dict' object has no attribute 'model_dump_json'` (push_tasks) deep inside."""
    with Client(resources) as client:
        pushed = client.push_tasks([TASK_JSON], name="rows")
        assert pushed == client.push_tasks([TASK], name="rows")  # the same content, once
        assert client.resolve_task(TASK_JSON) == client.resolve_task(TASK)
        assert client.resolve_task(pushed.task("add-two")) == (TASK, pushed.task("add-two"))
        code = ["```python\ndef add(a, b):\n    return a + b\n```"]
        grouped = client.run_group(TASK_JSON, code, group_id="rows", timeout=10)
        request = {"request_id": "as-json", "task": TASK_JSON, "files": {"solution.py": "x\n"}}
        (ran,) = client.run([request], timeout=10)
    assert [(r.status, r.reward) for r in [*grouped, ran]] == [(Status.SUCCEEDED, 1.0)] * 2
    assert {r.request_id: r.task for r in pipeline.ran}["as-json"] == TASK


def test_a_bad_task_is_an_input_error_at_the_call_naming_the_field_and_nothing_is_sent(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    scorer = r"grading\.scorer: Input should be 'tests_pass_fraction', .* or 'performance'$"
    with Client(resources) as client:
        calls = {
            "session": (lambda: client.session(BAD_TASK), rf"^task\.{scorer}"),
            "run_group": (lambda: client.run_group(BAD_TASK, ["x"]), rf"^task\.{scorer}"),
            "resolve_task": (lambda: client.resolve_task(BAD_TASK), rf"^task\.{scorer}"),
            "push_tasks": (lambda: client.push_tasks([TASK, BAD_TASK]), rf"^tasks\[1\]\.{scorer}"),
            "push_tasks_a_ref": (
                lambda: client.push_tasks(["set@v/add-two"]),
                r"^tasks\[0\]: expected a Task or the task's JSON as a dict, got str$",
            ),
            "push_tasks_one_task": (
                lambda: client.push_tasks(TASK),  # type: ignore[arg-type]
                r"^tasks: expected a list, got Task$",
            ),
            "submit": (
                lambda: client.submit([{"request_id": "r", "task": BAD_TASK}]),
                rf"^requests\[0\]\.task\.{scorer}",
            ),
            "submit_a_request_without_an_id": (
                lambda: client.submit([req("ok"), {"task_ref": "set@v/add-two"}]),
                r"^requests\[1\]\.request_id: Field required$",
            ),
            "a_number": (
                lambda: client.run_group(7, ["x"]),  # type: ignore[arg-type]
                r"^task: expected a Task, a task ref \(name@version/task_id\) or the task's "
                r"JSON as a dict, got int$",
            ),
            "a_malformed_ref": (
                lambda: client.session("add-two"),
                r"^task: task ref 'add-two' is not of the form taskset@version/task_id$",
            ),
            "a_ref_that_is_not_text": (
                lambda: client.resolve_task("a\ud800@v/t"),
                r"^task: task ref 'a\\ud800@v/t' is not valid Unicode text \(surrogates not "
                r"allowed at character 1\)$",
            ),
            "a_ref_with_a_nul": (
                lambda: client.run_group("a\x00@v/t", ["x"]),
                r"^task: task ref 'a\\x00@v/t' holds a control character$",
            ),
            "session_limits": (
                lambda: client.session(TASK, limits={"timeout_s": "soon"}),
                r"^limits\.timeout_s: Input should be a valid number",
            ),
        }
        raised = {}
        for name, (call, message) in calls.items():
            with pytest.raises(InputError) as caught:
                call()
            raised[name] = re.search(message, str(caught.value)) is not None or str(caught.value)
    assert raised == dict.fromkeys(calls, True)
    listed = aws.s3.list_objects_v2(Bucket="tasksets")
    assert listed.get("KeyCount") == 0 and pipeline.ran_ids == [] and pipeline.queued() == 0


SESSION_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    "tags_not_text": ({"tags": {"a": 1}}, r"^tags\.a: Input should be a valid string$"),
    "tags_a_list": ({"tags": ["a"]}, r"^tags: Input should be a valid dictionary$"),
    "run_id_a_number": ({"run_id": 5}, r"^run_id: Input should be a valid string$"),
    "episode_id_a_dict": ({"episode_id": {}}, r"^episode_id: Input should be a valid string$"),
    "files_not_text": ({"files": {"a.py": 5}}, r"^files\.a\.py\."),
    "files_outside": ({"files": {"../x": "x"}}, r"^files\.\.\./x\.\[key\]: "),
    "files_a_string": ({"files": "a.py"}, r"^files: Input should be a valid dictionary$"),
    "ttl_text": ({"ttl_s": "soon"}, r"^ttl_s: Input should be a valid number"),
    "ttl_nan": ({"ttl_s": float("nan")}, r"^ttl_s: Input should be a finite number$"),
    "ttl_negative": ({"ttl_s": -1}, r"^ttl_s: Input should be greater than or equal to 1$"),
    "ttl_over_a_day": ({"ttl_s": 86_401}, r"^ttl_s: Input should be less than or equal to 86400$"),
    "idle_inf": ({"idle_release_s": float("inf")}, r"^idle_release_s: Input should be a finite"),
    "idle_text": ({"idle_release_s": "5s"}, r"^idle_release_s: Input should be a valid number"),
}


@pytest.mark.parametrize("name", SESSION_ARGUMENTS)
def test_every_session_argument_is_read_at_the_call_on_both_faces(
    aws: Aws, resources: Resources, name: str
) -> None:
    """Was a break: only the task and the limits were read at the call; a bad tag, run_id,
    file or TTL raised pydantic's ValidationError, a TypeError or a SessionError inside
    open, after the session's two queues were made (and on AsyncClient at `await`)."""
    kwargs, message = SESSION_ARGUMENTS[name]
    queues = aws.sqs.list_queues().get("QueueUrls", [])
    with Client(resources) as client, pytest.raises(InputError, match=message):
        client.session(TASK, **kwargs)

    async def opening() -> None:
        async with AsyncClient(resources) as aio:
            aio.session(TASK, **kwargs)  # never awaited: refused at the call

    with pytest.raises(InputError, match=message):
        asyncio.run(opening())
    assert aws.sqs.list_queues().get("QueueUrls", []) == queues


GROUP_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    "none": ({"completions": None}, r"^completions: Input should be a valid list$"),
    "a_none": ({"completions": [None]}, r"^completions\[0\]: Input should be a valid string$"),
    "bytes": ({"completions": [b"x"]}, r"^completions\[0\]: Input should be a valid string$"),
    "messages": (
        {"completions": [[{"role": "assistant", "content": "x"}]]},
        r"^completions\[0\]: Input should be a valid string$",
    ),
    "a_dict": ({"completions": {"a": "x"}}, r"^completions: Input should be a valid list$"),
    "extract_text": ({"extract": "x"}, r"^extract: Input should be callable$"),
    "extract_none": ({"extract": None}, r"^extract: Input should be callable$"),
    "group_id_surrogate": (
        {"group_id": "g\ud800"},
        r"^group_id: the text is not valid Unicode text",
    ),
    "timeout_text": ({"timeout": "x"}, r"^timeout: Input should be a valid number"),
}


@pytest.mark.parametrize("name", GROUP_ARGUMENTS)
def test_every_run_group_argument_is_read_at_the_call(
    aws: Aws, resources: Resources, pipeline: Pipeline, name: str
) -> None:
    """Was a break: None, [None], [b"..."] raised a raw TypeError, TRL's conversational
    completions and a dict were graded 0.0 `no_code` (a silent wrong reward), a bad extract,
    group_id or timeout raised raw TypeError or UnicodeEncodeError."""
    kwargs, message = GROUP_ARGUMENTS[name]
    call = {"completions": ["```python\nx = 1\n```"]} | kwargs
    with Client(resources) as client, pytest.raises(InputError, match=message):
        client.run_group(TASK, **call)
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


def test_completions_as_a_tuple_or_a_generator_are_each_graded(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    code = "```python\nx = 1\n```"
    with Client(resources) as client:
        assert len(client.run_group(TASK, (code, "no code"), timeout=10)) == 2
        generated = (c for c in [code, code])
        graded = client.run_group(TASK, generated, group_id="gen")  # type: ignore[arg-type]
    assert [r.status for r in graded] == [Status.SUCCEEDED] * 2


@pytest.mark.parametrize(
    ("concurrency", "message"),
    [
        (float("nan"), r"^concurrency: Input should be a valid integer$"),
        ("2", r"^concurrency: Input should be a valid integer$"),
        (0, r"^concurrency: Input should be greater than or equal to 1$"),
        (True, r"^concurrency: Input should be a valid integer$"),
    ],
)
def test_a_clients_concurrency_is_a_whole_number_at_least_one(
    resources: Resources, concurrency: Any, message: str
) -> None:
    """Was a break: concurrency=nan was taken, and `len(in_flight) < nan` never admitted a
    request: every wait hung. "2" raised a raw TypeError."""
    with pytest.raises(InputError, match=message):
        Client(resources, concurrency=concurrency)
    with pytest.raises(InputError, match=message):
        AsyncClient(resources, concurrency=concurrency)


def test_push_tasks_refuses_a_task_id_given_twice_naming_it(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    """Was a break: two tasks with one id were pushed; the SDK read the last, the pipeline
    the first, so a session opened on one task and was graded on the other."""
    other = TASK_JSON | {"limits": {"timeout_s": 99}}
    with Client(resources) as client, pytest.raises(InputError) as caught:
        client.push_tasks([TASK, TASK_JSON | {"task_id": "b"}, other])
    assert str(caught.value) == "tasks[2].task_id: duplicate task_id 'add-two' (first at tasks[0])"
    assert aws.s3.list_objects_v2(Bucket="tasksets").get("KeyCount") == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (None, r"^name: Input should be a valid string$"),
        (5, r"^name: Input should be a valid string$"),
        ("", r"^name: String should have at least 1 character$"),
        ("a" * 201, r"^name: String should have at most 200 characters$"),
    ],
)
def test_push_tasks_reads_its_name_at_the_call(
    aws: Aws, resources: Resources, name: Any, message: str
) -> None:
    """Was a break: push_tasks(name=None or 5) raised a raw TypeError from taskset_name."""
    with Client(resources) as client, pytest.raises(InputError, match=message):
        client.push_tasks([TASK], name=name)
    assert aws.s3.list_objects_v2(Bucket="tasksets").get("KeyCount") == 0


BAD_ROWS = {
    "not_json": (b"not json at all\n", "task set rows@{v}: line 1 is not JSON"),
    "not_utf8": (b"\xff\xfe garbage\n", "task set rows@{v}: line 1 is not JSON"),
    "too_deep": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "task set rows@{v}: line 1 is not JSON"),
    "extra_field": (
        (json.dumps(TASK_JSON | {"bogus": 1}) + "\n").encode(),
        "task '{ref}' (line 1 of its task set): bogus: Extra inputs are not permitted",
    ),
    "bad_limit": (
        (json.dumps(TASK_JSON | {"limits": {"timeout_s": -1}}) + "\n").encode(),
        "task '{ref}' (line 1 of its task set): limits.timeout_s: Input should be greater than 0",
    ),
}


@pytest.mark.parametrize("name", BAD_ROWS)
def test_a_ref_into_a_pushed_set_with_a_bad_row_is_an_input_error_naming_the_row(
    aws: Aws, resources: Resources, pipeline: Pipeline, tmp_path: Path, name: str
) -> None:
    """Was a break: push_taskset takes a file as it is, and resolve_task, session and
    run_group on a ref into it raised raw JSONDecodeError, UnicodeDecodeError, RecursionError
    or pydantic's ValidationError. Each is an InputError naming the set, the line and the
    field, with nothing sent."""
    body, message = BAD_ROWS[name]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(body)
    with Client(resources) as client:
        pushed = client.push_taskset(path)
        ref = pushed.task("add-two")
        for call in (
            lambda: client.resolve_task(ref),
            lambda: client.session(ref, ttl_s=60),
            lambda: client.run_group(ref, ["```python\nx = 1\n```"], timeout=5),
        ):
            with pytest.raises(InputError) as caught:
                call()
            assert str(caught.value) == message.format(v=pushed.version, ref=ref)
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


def test_a_bad_row_or_one_without_an_id_leaves_the_sets_other_tasks_readable(
    aws: Aws, resources: Resources, pipeline: Pipeline, tmp_path: Path
) -> None:
    rows = [TASK_JSON | {"task_id": "b", "x": 1}, [1, 2], {"no_task_id": 1}, TASK_JSON]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with Client(resources) as client:
        ref = client.push_taskset(path).task("add-two")
        assert client.resolve_task(ref) == (TASK, ref)
        with pytest.raises(SessionError, match=r"^task_ref: no task 'c' in rows$"):
            client.resolve_task(ref.replace("/add-two", "/c"))


def test_completions_given_as_one_string_are_refused_never_graded_per_character(
    aws: Aws, resources: Resources, pipeline: Pipeline
) -> None:
    """Was a break: `run_group(task, "def add...")` graded each character as a completion."""
    with Client(resources) as client, pytest.raises(InputError) as caught:
        client.run_group(TASK, "```python\nx = 1\n```", timeout=5)
    assert str(caught.value) == "completions: a list of completions (str), not one string"
    assert pipeline.ran_ids == [] and pipeline.queued() == 0


def test_a_session_on_a_task_given_as_its_json_opens_with_that_task(
    aws: Aws, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a break: `client.session(task={...})` failed with `AttributeError: 'dict' object
    has no attribute 'task_id'`. With no worker, the open times out; the open queue holds
    the session's spec, with the task's starter files and never its hidden tests."""
    monkeypatch.setattr(sessions, "OPEN_TIMEOUT_S", 0.5)
    monkeypatch.setattr(sessions, "REPLY_WAIT_S", 0)
    with_sessions = dataclasses.replace(
        resources, open_queue_url=aws.work_queue, session_queue_prefix="redteam-"
    )
    with Client(with_sessions) as client, pytest.raises(SessionError, match="no worker took"):
        client.session(task=TASK_JSON, ttl_s=60)
    (message,) = aws.sqs.receive_message(QueueUrl=aws.work_queue)["Messages"]
    spec = SessionOpen.model_validate_json(message["Body"]).session
    assert (spec.task_id, spec.workspace) == (TASK.task_id, TASK.workspace)
    assert "test_add" not in message["Body"]


# --- trialbox run ---------------------------------------------------------------------------------


def test_trialbox_run_sends_a_sample_over_128_kib_by_pointer(
    tmp_path: Path,
    aws: Aws,
    resources: Resources,
    pipeline: Pipeline,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = "def add(a, b):\n    return a + b\n" + "# " + "é" * 70_000 + "\n"  # 140 KB, 70 K chars
    samples = tmp_path / "samples.jsonl"
    rows = [
        {"task_id": "add-two", "sample_id": "big", "files": {"solution.py": big}},
        {"task_id": "add-two", "sample_id": "small", "files": {"solution.py": "x = 1\n"}},
    ]
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(runs, "connect", lambda *_: Client(resources, concurrency=1))
    job = runs.RunJob(TASKS, samples, tmp_path / "out.jsonl", concurrency=1)
    assert job.prepare() == []
    job.execute(lambda row: None, lambda: None)
    assert job.failure is None and job.missing == 0
    assert [(r["sample_id"], r["status"]) for r in job.ordered] == [
        ("big", "succeeded"),
        ("small", "succeeded"),
    ]
    assert {r.sample_id: r.files["solution.py"] for r in pipeline.ran}["big"] == big
