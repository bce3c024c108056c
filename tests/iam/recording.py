"""A recorded twin run (tests/iam/conftest.py records one per module): every AWS call each
principal makes, from the twin's request log (trialbox.local.requestlog), while the SDK and the
CLI drive the paths a trainer's run takes: correct and wrong answers, a request over 128 KiB,
rejections by the dispatcher and by Prepare, a sandbox error, a reused request id, trace
downloads, and, last because it deletes the traces bucket, a Record that fails into the state
machine's own fallback write."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.iam.operations import queue_arn
from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox.cli.run import run_job
from trialbox.errors import RequestIdReused
from trialbox.integrations.sandbox_fusion import Proxy
from trialbox.keys import execution_arn
from trialbox.local import principals
from trialbox.local.requestlog import ENV_REQUEST_LOG
from trialbox.local.resources import REGION
from trialbox.local.services import CREDENTIALS
from trialbox.local.services import client as twin_client
from trialbox.local.twin import LocalTwin
from trialbox.models import ExecutionResult, RunReport, Status, Task
from trialbox.models.batches import BatchInput
from trialbox.models.jobs import JobSpec
from trialbox.models.sessions import TAG_EXPIRES
from trialbox.pipeline.admission import CAPACITY_CACHE_S, Admission
from trialbox.pipeline.claims import Claims, lease_s
from trialbox.pipeline.stores import ObjectStore
from trialbox.runs import RunJob
from trialbox.sandbox.runner import Runner
from trialbox.sdk import Client, Resources
from trialbox.sdk.core import local_session
from trialbox.worker.batched import BatchedJobs
from trialbox.worker.loop import Worker
from trialbox.worker.run import job_runner
from trialbox.worker.sessions import SessionHost

WRONG = "def add(a, b):\n    return 3\n"
SETTLED = ("iam-settle-1", "iam-settle-2")  # a batch whose Run fails: Settle answers them
GHOST = "iam-ghost"  # admitted for a worker that takes it and dies, then cancelled
WAITED = "iam-waited"  # cancelled while it waited in the dispatcher for a slot
DEAD_LETTERED = "iam-deadletter"  # left in the requests DLQ as SQS's redrive does
HARNESS = "iam-harness"  # the test's own calls: setting scenes up, no principal's
# The worker beats every 2 s: a 5 s job beats and extends its visibility. With no worker, a
# /run_code call must miss its deadline (wait_s: about 26 s) before 3 lapsed heartbeats fail it.
HEARTBEAT_S = 10
BROKEN = "iam-broken"  # its runner fails after a few heartbeats: a sandbox_error


@dataclass
class Recorded:
    template: dict[str, Any]
    entries: list[dict[str, Any]]  # the request log, one dict per call
    tokens: dict[str, str]  # task token -> the state machine that issued it
    results: dict[str, ExecutionResult]
    cli_exit: int
    cli_traces: list[str]


def _runner(store: ObjectStore) -> Any:
    real = job_runner(Runner(), store)

    def run(job: JobSpec, stop: threading.Event) -> RunReport:
        if job.request_id.startswith(BROKEN):
            time.sleep(5)
            raise RuntimeError("the sandbox broke (a test double for a runner failure)")
        return real(job, stop)

    return run


def start_worker(twin: LocalTwin, name: str) -> Worker:
    """A pool worker with the test's runner (the twin's own are processes with the real one),
    on a thread, signing as the pool's task role."""

    def aws(service: str) -> Any:
        return twin_client(twin.endpoint_url, service, principals.WORKER)

    jobs = ObjectStore(aws("s3"), twin.output(c.OUTPUT_TRACES_BUCKET))
    sqs = aws("sqs")
    worker = Worker(
        sqs=sqs,
        sfn=aws("stepfunctions"),
        jobs=jobs,
        queue_url=twin.output(c.OUTPUT_WORK_QUEUE_URL),
        run_job=_runner(jobs),
        heartbeat_s=HEARTBEAT_S,
        name=name,
        wait_s=1,
        sessions=SessionHost(
            Runner(), sqs, jobs, name, queue_prefix=twin.output(c.OUTPUT_SESSION_QUEUE_PREFIX)
        ),
        open_queue_url=twin.output(c.OUTPUT_OPEN_QUEUE_URL),
        admission=Admission(aws("dynamodb"), twin.output(c.OUTPUT_ADMISSION_TABLE)),
        batched=BatchedJobs(
            sqs,
            twin.output(c.OUTPUT_WORK_QUEUE_URL),
            twin.output(c.OUTPUT_FINISH_QUEUE_URL),
            Claims(aws("dynamodb"), twin.output(c.OUTPUT_ADMISSION_TABLE), lease_s(HEARTBEAT_S)),
            HEARTBEAT_S,
            name,
        ),
    )
    threading.Thread(target=worker.serve, daemon=True, name=name).start()
    return worker


def _sdk(twin: LocalTwin) -> Client:
    session = boto3.session.Session(
        aws_access_key_id=principals.SDK, aws_secret_access_key="x", region_name=REGION
    )
    return Client(Resources.from_outputs(twin.outputs), endpoint_url=twin.endpoint_url,
                  session=session)  # fmt: skip


def _running(twin: LocalTwin, name: str) -> bool:
    sfn = twin_client(twin.endpoint_url, "stepfunctions", HARNESS)
    arn = execution_arn(twin.output(c.OUTPUT_ROLLOUT_ARN), name)
    try:
        return bool(sfn.describe_execution(executionArn=arn)["status"] == "RUNNING")
    except sfn.exceptions.ExecutionDoesNotExist:
        return False


def _await_dead_letter(dlq_url: str) -> None:
    """Until the dispatcher has sent a message to the requests DLQ (read from the request log:
    the DLQ's consumer takes the message itself at once)."""
    log = Path(os.environ[ENV_REQUEST_LOG])
    dlq = queue_arn(dlq_url).rsplit(":", 1)[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            sent = entry.get("body") or entry.get("form") or {}
            if "Dispatcher" in entry["key"] and "SendMessage" in line and dlq in json.dumps(sent):
                return
        time.sleep(1)
    raise AssertionError("the reused request id was never dead-lettered")


def _dead_lettered_request(twin: LocalTwin, sqs: Any, dlq_url: str) -> ExecutionResult:
    """A request whose StartExecution failed on every delivery, as SQS's redrive leaves it in
    the DLQ: its consumer writes its one `sandbox_error` result."""
    body = request(DEAD_LETTERED, CORRECT).model_dump_json(exclude_defaults=True)
    sqs.send_message(QueueUrl=dlq_url, MessageBody=body)
    return _result_of(twin, DEAD_LETTERED)


def tokens(sfn: Any, calls: list[dict[str, Any]]) -> dict[str, str]:
    """Each task token a principal answered, mapped to the state machine whose TaskScheduled
    event issued it (from the executions' histories)."""
    wanted = {
        e["body"]["taskToken"]
        for e in calls
        if isinstance(e.get("body"), dict) and "taskToken" in e["body"]
    }
    found: dict[str, str] = {}
    for machine in sfn.list_state_machines()["stateMachines"]:
        arn = machine["stateMachineArn"]
        for execution in sfn.list_executions(stateMachineArn=arn)["executions"]:
            history = sfn.get_execution_history(executionArn=execution["executionArn"])
            for event in history["events"]:
                parameters = event.get("taskScheduledEventDetails", {}).get("parameters", "")
                found.update({t: arn for t in wanted if t in parameters})
    return found


def _batch_count(twin: LocalTwin) -> int:
    sfn = twin_client(twin.endpoint_url, "stepfunctions", HARNESS)
    found = sfn.list_executions(stateMachineArn=twin.output(c.OUTPUT_BATCH_ARN))
    return len(found["executions"])


def _batches(twin: LocalTwin, sdk: Client, sqs: Any) -> dict[str, ExecutionResult]:
    """Pairs sent together while both workers' slots are free, so that each starts as one
    Batch execution: one whose samples are all rejected by its Run (which then answers its
    own token), one through S3 with a runner failure (the finisher's failure path), and one
    whose running sample's message comes again, to the dispatcher and to the requests DLQ
    (each finds the batch that carries it)."""
    pairs = [
        [
            request("iam-b-noref", CORRECT, task=None, task_ref="nothing@1/add-two"),
            request("iam-b-nockpt", CORRECT, base_checkpoint="0" * 64),
        ],
        [
            request("iam-b-big", CORRECT + "# " + "x" * 200_000 + "\n"),
            request(f"{BROKEN}-b", CORRECT),
        ],
    ]
    results: dict[str, ExecutionResult] = {}
    for pair in pairs:
        started = _batch_count(twin)
        results |= dict(zip([r.request_id for r in pair], sdk.run(pair, timeout=180), strict=True))
        assert _batch_count(twin) == started + 1, "the pair did not start as one batch"
    slow = request("iam-b-slow", CORRECT, commands=[["sleep", "6"]])
    started = _batch_count(twin)
    handles = sdk.submit([slow, request("iam-b-wrong", WRONG)])
    deadline = time.monotonic() + 60
    while _batch_count(twin) == started:
        assert time.monotonic() < deadline, "the pair never started"
        time.sleep(0.2)
    body = slow.model_dump_json(exclude_defaults=True)
    sqs.send_message(QueueUrl=twin.output(c.OUTPUT_REQUESTS_QUEUE_URL), MessageBody=body)
    sqs.send_message(QueueUrl=_requests_dlq(sqs, twin), MessageBody=body)
    results |= {h.request_id: h.result(timeout=120) for h in handles}
    assert _batch_count(twin) == started + 1, "the pair did not start as one batch"
    return results


def _requests_dlq(sqs: Any, twin: LocalTwin) -> str:
    url = twin.output(c.OUTPUT_REQUESTS_QUEUE_URL)
    redrive = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    dlq_name = json.loads(redrive["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"]
    return str(sqs.get_queue_url(QueueName=dlq_name.rsplit(":", 1)[-1])["QueueUrl"])


def _settled_batch(twin: LocalTwin) -> dict[str, ExecutionResult]:
    """A batch whose Run fails (its requests' object was never written): the Batch state
    machine's Catch runs Settle, which gives each of its samples its `sandbox_error`. Started
    by hand: a dispatcher writes the object before it starts a batch."""
    table = twin_client(twin.endpoint_url, "dynamodb", HARNESS)
    admission = Admission(table, twin.output(c.OUTPUT_ADMISSION_TABLE))
    admission.lease("iam-settle-worker", len(SETTLED), term_s=60)
    for request_id in SETTLED:
        assert admission.admit(request_id)
    batch = BatchInput(
        batch_id="b-iam-settle",
        requests_uri=f"s3://{twin.output(c.OUTPUT_TRACES_BUCKET)}/batches/b-iam-settle.json",
        request_ids=list(SETTLED),
    )
    sfn = twin_client(twin.endpoint_url, "stepfunctions", HARNESS)
    sfn.start_execution(stateMachineArn=twin.output(c.OUTPUT_BATCH_ARN), name=batch.batch_id,
                        input=batch.model_dump_json())  # fmt: skip
    admission.leave("iam-settle-worker")
    return {request_id: _result_of(twin, request_id) for request_id in SETTLED}


def _result_of(twin: LocalTwin, request_id: str) -> ExecutionResult:
    table = twin_client(twin.endpoint_url, "dynamodb", HARNESS)
    key = {c.TABLE_KEY: {"S": request_id}}
    deadline = time.monotonic() + 60
    while "Item" not in (item := table.get_item(TableName=twin.output(c.OUTPUT_EXECUTIONS_TABLE),
                                                Key=key, ConsistentRead=True)):  # fmt: skip
        assert time.monotonic() < deadline, f"{request_id} got no result"
        time.sleep(0.5)
    return ExecutionResult.model_validate_json(item["Item"]["result"]["S"])


def _cli_run(twin: LocalTwin, tmp: Path) -> tuple[int, list[str]]:
    """`trialbox run --endpoint-url` on two samples, with the SDK's credentials."""
    tasks, samples = tmp / "tasks.jsonl", tmp / "samples.jsonl"
    tasks.write_text(json.dumps(ADD_TASK) + "\n")
    rows = [
        {"task_id": "add-two", "sample_id": "right", "files": {"solution.py": CORRECT}},
        {"task_id": "add-two", "sample_id": "wrong", "files": {"solution.py": WRONG}},
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    traces = tmp / "traces"
    outputs = twin.outputs
    env = CREDENTIALS | {  # the SDK's
        c.ENV_REQUESTS_QUEUE_URL: outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
        c.ENV_EXECUTIONS_TABLE: outputs[c.OUTPUT_EXECUTIONS_TABLE],
        c.ENV_TRACES_BUCKET: outputs[c.OUTPUT_TRACES_BUCKET],
        c.ENV_TASKSETS_BUCKET: outputs[c.OUTPUT_TASKSETS_BUCKET],
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        code = run_job(RunJob(tasks, samples, tmp / "out.jsonl", endpoint_url=twin.endpoint_url,
                              run_id="iam-cli", traces_dir=traces, timeout_s=120))  # fmt: skip
    return code, sorted(p.name for p in traces.glob("*.json"))


def _session_calls(sdk: Client, results: dict[str, ExecutionResult]) -> None:
    """A session on a pushed task (the SDK reads the task set), with a result too large for
    a message (read from its trace file) and a grade; a second one outlives its TTL, so that
    its worker deletes its queues."""
    ref = sdk.push_tasks([Task.model_validate(ADD_TASK)], name="iam-session")
    loud = ["python", "-c", "import sys; print('x' * 70000); print('y' * 70000, file=sys.stderr)"]
    with sdk.session(ref.task("add-two"), ttl_s=120) as session:
        big = session.step(files={"solution.py": CORRECT}, commands=[loud, loud])
        assert big.commands[0].stdout_truncated and session.read_file("solution.py")
        results["iam-session-grade"] = session.grade(timeout=120)
    short = sdk.session(Task.model_validate(ADD_TASK), ttl_s=3)
    short.exec(["true"])
    time.sleep(5)  # the TTL passes: the worker ends the session and deletes its queues
    short.close()


def _run_code_calls(twin: LocalTwin) -> None:
    """SandboxFusion's /run_code through the proxy (signed as the SDK's principal) and the
    twin's function URL: a call, one over 128 KiB that the function sends by reference, and
    one whose result is over 300 KB, which the function reads from its trace."""
    proxy = Proxy(twin.output(c.OUTPUT_RUN_CODE_URL), local_session(), timeout_s=120)
    big = base64.b64encode(b"x" * 200_000).decode()
    calls = [
        {"code": "print(6 * 7)", "language": "python"},
        {"code": "print(len(open('big').read()))", "language": "python", "files": {"big": big}},
        {"code": "print('y' * 400_000)", "language": "python"},  # read from its trace
    ]
    for call, printed in zip(calls, ["42\n", "200000\n", "y" * 400_000 + "\n"], strict=True):
        status, body = proxy.answer(json.dumps(call).encode())
        assert (status, json.loads(body)["run_result"]["stdout"]) == (200, printed), body


def _run_code_missing_its_deadline(twin: LocalTwin) -> None:
    """With no worker to run it, a /run_code call misses its deadline: the function cancels
    it (PutItem of its `cancelled` result, StopExecution) and answers 504."""
    proxy = Proxy(twin.output(c.OUTPUT_RUN_CODE_URL), local_session(), timeout_s=120)
    call = {"code": "print(1)", "language": "python", "run_timeout": 1}
    status, body = proxy.answer(json.dumps(call).encode())
    assert (status, "cancelled" in json.loads(body)["message"]) == (504, True), body


def _leftover_queues(twin: LocalTwin, sqs: Any) -> tuple[str, str]:
    """Session queues nobody will end: one past its TTL (the reaper deletes it) and one made
    by hand without the tag (the reaper reads its age and keeps it)."""
    prefix = twin.output(c.OUTPUT_SESSION_QUEUE_PREFIX)
    expired = sqs.create_queue(QueueName=f"{prefix}iam-expired-in",
                               tags={TAG_EXPIRES: str(int(time.time()) - 3600)})  # fmt: skip
    byhand = sqs.create_queue(QueueName=f"{prefix}iam-byhand-in")
    return expired["QueueUrl"], byhand["QueueUrl"]


def _entered(twin: LocalTwin, name: str, state: str) -> bool:
    sfn = twin_client(twin.endpoint_url, "stepfunctions", HARNESS)
    arn = execution_arn(twin.output(c.OUTPUT_ROLLOUT_ARN), name)
    events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return any(e.get("stateEnteredEventDetails", {}).get("name") == state for e in events)


def _cancelled_while_it_waited(twin: LocalTwin, sdk: Client) -> ExecutionResult:
    """With no worker, no slot: a request waits in a dispatcher for one, and its client
    cancels it meanwhile. A slot then comes (a lease written by hand): the dispatcher admits
    the request, finds its result, and gives the slot back (a transaction that deletes its
    marker) instead of starting it."""
    sqs = twin_client(twin.endpoint_url, "sqs", HARNESS)
    url = twin.output(c.OUTPUT_REQUESTS_QUEUE_URL)
    held = "ApproximateNumberOfMessagesNotVisible"

    def in_queue(attribute: str) -> int:
        answer = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])
        return int(answer["Attributes"][attribute])

    def asked_for_a_slot() -> int:
        """A dispatcher's table calls that name this request (from the request log): its
        check that the request has no result, then its read of the request's slot marker,
        after which it waits. An earlier scene's message hidden in the queue does not count,
        as it did when this waited for a hidden message."""
        log = Path(os.environ[ENV_REQUEST_LOG]).read_text().splitlines()
        dispatcher = principals.function("Dispatcher")
        return sum(
            1
            for line in log
            if WAITED in line and json.loads(line)["key"].startswith(dispatcher)
            and json.loads(line)["service"] == "dynamodb"
        )  # fmt: skip

    admission = Admission(twin_client(twin.endpoint_url, "dynamodb", HARNESS),
                          twin.output(c.OUTPUT_ADMISSION_TABLE))  # fmt: skip
    (handle,) = sdk.submit([request(WAITED, CORRECT)])
    deadline = time.monotonic() + 30
    while asked_for_a_slot() < 2:  # a dispatcher waits for a slot for it, in its window
        assert time.monotonic() < deadline, "no dispatcher took the request"
        time.sleep(0.2)
    sdk.cancel([handle])
    result = handle.result(timeout=5)
    before = admission.in_flight()
    admission.lease("iam-waited-worker", 1, term_s=30)
    while in_queue(held) or in_queue("ApproximateNumberOfMessages"):
        assert time.monotonic() < deadline + 30, "the dispatcher never let the request go"
        time.sleep(0.2)
    assert admission.in_flight() <= before, "the dispatcher kept the slot of a request that ended"
    admission.leave("iam-waited-worker")
    # The dispatchers read the capacity at most every CAPACITY_CACHE_S: the next request (the
    # /run_code call that must wait its window out and go back to the queue) must see none.
    time.sleep(CAPACITY_CACHE_S + 0.5)
    return result


def _cancelled_before_a_worker_took_it(twin: LocalTwin, sdk: Client) -> ExecutionResult:
    """A slot leased by a worker that marks the job taken and dies with it (a lease and a take
    written by hand, never a run), the request admitted; its Execute heartbeat lapses (the
    state machine reads the marker: taken, so a lost sandbox, and it clears the taker for the
    retry), and then it is cancelled: Record never runs, no worker holds the slot, so the
    reaper gives it back (it sees the request's result), and deletes the lapsed lease."""
    table = twin_client(twin.endpoint_url, "dynamodb", HARNESS)
    admission = Admission(table, twin.output(c.OUTPUT_ADMISSION_TABLE))
    admission.lease("iam-ghost-worker", 1, term_s=5)
    (handle,) = sdk.submit([request(GHOST, CORRECT)])
    deadline = time.monotonic() + 60
    while not _running(twin, GHOST):
        assert time.monotonic() < deadline, "the ghost worker's request was never admitted"
        time.sleep(0.2)
    assert admission.take(GHOST, "iam-ghost-worker")
    while not _entered(twin, GHOST, "CountLost"):
        assert time.monotonic() < deadline + HEARTBEAT_S, "its heartbeat never lapsed"
        time.sleep(0.5)
    sdk.cancel([handle])
    while admission.in_flight() or admission._leases():
        assert time.monotonic() < deadline + 60, "the reaper never gave the slot back"
        time.sleep(1)
    return handle.result(timeout=5)


def _lost_host(
    twin: LocalTwin, sdk: Client, workers: list[Worker], results: dict[str, ExecutionResult]
) -> None:
    """From here the twin's own worker process (an ECS task in the twin) serves: a session's
    host is SIGKILLed mid-call, so that the SDK asks ECS why it stopped. Between the two, no
    worker runs: a /run_code call misses its deadline."""
    for worker in workers:
        worker.stop.set()
        if worker.sessions is not None:
            worker.sessions.stop()  # its inbox goes, as the worker process's does at its exit
    time.sleep(2)  # their long polls (1 s) end
    results[WAITED] = _cancelled_while_it_waited(twin, sdk)
    _run_code_missing_its_deadline(twin)
    results[GHOST] = _cancelled_before_a_worker_took_it(twin, sdk)
    twin.add_worker()
    assert twin.pool is not None
    with sdk.session(Task.model_validate(ADD_TASK), ttl_s=120) as session:
        session.exec(["true"])
        threading.Timer(1.5, twin.pool.kill).start()
        lost = session.exec(["sleep", "30"])
        assert lost.status == Status.SANDBOX_ERROR and lost.loss_mask, lost
        assert "ECS: Essential container in task exited" in (lost.error or ""), (
            lost,
            session.worker,
        )
        assert session.exec(["true"]).status == Status.SUCCEEDED


def _delete_bucket(s3: Any, bucket: str) -> None:
    """Empty and delete a bucket that late writers (a Recorder still tracing, a worker's
    session file) may write to meanwhile: again until it is gone."""
    deadline = time.monotonic() + 60
    while True:
        for found in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=found["Key"])
        try:
            s3.delete_bucket(Bucket=bucket)
            return
        except s3.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] != "BucketNotEmpty" or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def drive(
    twin: LocalTwin, tmp: Path, workers: list[Worker]
) -> tuple[dict[str, ExecutionResult], int, list[str]]:
    sdk = _sdk(twin)
    sqs = twin_client(twin.endpoint_url, "sqs", HARNESS)
    expired, byhand = _leftover_queues(twin, sqs)
    s3 = twin_client(twin.endpoint_url, "s3", HARNESS)
    requests_url = twin.output(c.OUTPUT_REQUESTS_QUEUE_URL)
    # A body the dispatcher rejects itself (it writes the `rejected` result).
    invalid = {"request_id": "iam-invalid", "task": ADD_TASK, "limits": {"memory_mb": 0}}
    sqs.send_message(QueueUrl=requests_url, MessageBody=json.dumps(invalid))
    # A large request sent inline, around the SDK: the dispatcher stores it in payloads/.
    raw_big = request("iam-rawbig", CORRECT + "# " + "x" * 200_000 + "\n")
    sqs.send_message(QueueUrl=requests_url, MessageBody=raw_big.model_dump_json())
    results: dict[str, ExecutionResult] = {}
    (results["iam-invalid"],) = sdk.run([request("iam-invalid", CORRECT)], timeout=60)
    (results["iam-rawbig"],) = sdk.run([raw_big], timeout=120)  # its result, already there
    alone = [
        request("iam-good", CORRECT, checkpoint=True),  # the worker stores a checkpoint
        request("iam-wrong", WRONG),
        request("iam-nockpt", CORRECT, base_checkpoint="0" * 64),  # Prepare: 404
        request("iam-big", CORRECT + "# " + "x" * 200_000 + "\n"),  # through S3
        request("iam-noref", CORRECT, task=None, task_ref="nothing@1/add-two"),  # Prepare
        request(BROKEN, CORRECT),
    ]
    for one in alone:  # each its own Rollout execution
        (results[one.request_id],) = sdk.run([one], timeout=180)
    results |= _batches(twin, sdk, sqs)
    # A turn from iam-good's checkpoint: Prepare finds it, the worker reads it.
    checkpoint = results["iam-good"].checkpoint
    (results["iam-turn"],) = sdk.run([request("iam-turn", WRONG, base_checkpoint=checkpoint)],
                                     timeout=120)  # fmt: skip
    _session_calls(sdk, results)
    _run_code_calls(twin)
    _lost_host(twin, sdk, workers, results)
    deadline = time.monotonic() + 30
    while expired in sqs.list_queues().get("QueueUrls", []):
        assert time.monotonic() < deadline, "the reaper did not delete an expired session queue"
        time.sleep(1)
    assert byhand in sqs.list_queues()["QueueUrls"]
    assert results["iam-good"].trace_uri is not None
    sdk.read_object(results["iam-good"].trace_uri)
    # The same request id with other content: the SDK refuses it.
    with pytest.raises(RequestIdReused):
        sdk.submit([request("iam-good", WRONG)])
    # Cancelled in flight: the SDK records `cancelled` and stops the execution. While it
    # runs, its id with other content, sent around the SDK, is dead-lettered by the
    # dispatcher (its execution's input says what it runs).
    (slow,) = sdk.submit([request("iam-cancel", CORRECT, commands=[["sleep", "8"]])])
    deadline = time.monotonic() + 60
    while not _running(twin, "iam-cancel"):
        assert time.monotonic() < deadline, "the execution to cancel never started"
        time.sleep(0.2)
    reused = request("iam-cancel", WRONG).model_dump_json(exclude_defaults=True)
    sqs.send_message(QueueUrl=requests_url, MessageBody=reused)
    dlq = _requests_dlq(sqs, twin)
    _await_dead_letter(dlq)
    sdk.cancel([slow])
    results["iam-cancel"] = slow.result(timeout=5)
    results[DEAD_LETTERED] = _dead_lettered_request(twin, sqs, dlq)
    results |= _settled_batch(twin)
    cli_exit, cli_traces = _cli_run(twin, tmp)
    # Last: without the traces bucket Prepare fails, and Record on every retry; the state
    # machine then writes the `sandbox_error` result itself.
    _delete_bucket(s3, twin.output(c.OUTPUT_TRACES_BUCKET))
    (results["iam-norecord"],) = sdk.run([request("iam-norecord", CORRECT)], timeout=120)
    sdk.close()
    return results, cli_exit, cli_traces
