"""The worker against a real (moto-executed) waitForTaskToken state."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox import keys
from trialbox.errors import SandboxError
from trialbox.models import RunReport, Status, Task
from trialbox.models.jobs import ExecutionDone, JobSpec
from trialbox.sandbox.runner import Runner
from trialbox.worker.loop import Worker
from trialbox.worker.run import job_runner


def waiting_machine(aws: Aws, heartbeat_s: int = 30, retries: int = 0) -> str:
    execute: dict[str, Any] = {
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "HeartbeatSeconds": heartbeat_s,
        "TimeoutSeconds": 120,
        "Parameters": {
            "QueueUrl": aws.work_queue,
            "MessageBody": {
                "task_token.$": "$$.Task.Token",
                "request_id.$": "$.request_id",
                "job_uri.$": "$.job_uri",
                "attempt.$": "$$.State.RetryCount",
            },
        },
        "End": True,
    }
    if retries:  # moto reports a lapsed heartbeat as States.Timeout (AWS: HeartbeatTimeout)
        lost = ["States.HeartbeatTimeout", "States.Timeout"]
        execute["Retry"] = [{"ErrorEquals": lost, "MaxAttempts": retries, "IntervalSeconds": 1}]
    return aws.state_machine(
        f"execute-{retries}", {"StartAt": "Execute", "States": {"Execute": execute}}
    )


def job(aws: Aws, request_id: str, solution: str = CORRECT) -> str:
    spec = JobSpec(
        request_id=request_id,
        task=Task.model_validate(ADD_TASK),
        files={"solution.py": solution},
        limits=Task.model_validate(ADD_TASK).limits,
    )
    return aws.traces.put_json(f"jobs/{request_id}/job.json", spec)


def start(aws: Aws, machine: str, request_id: str, job_uri: str) -> str:
    payload = json.dumps({"request_id": request_id, "job_uri": job_uri})
    started = aws.sfn.start_execution(stateMachineArn=machine, name=request_id, input=payload)
    return str(started["executionArn"])


def wait_for(aws: Aws, arn: str, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        described = aws.sfn.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return dict(described)
        time.sleep(0.1)
    raise AssertionError("the execution did not finish")


# How long a worker may take to stop once its job is over (an answer, a delete: moto's calls),
# or to hand a job back once its grace ended: a stop that hangs fails, a slow job does not.
STOPPED_S = 15


def worker(aws: Aws, run_job: Any) -> Worker:
    return Worker(aws.sqs, aws.sfn, aws.traces, aws.work_queue, run_job, heartbeat_s=3, wait_s=1)


def test_the_worker_runs_the_job_and_answers_the_token(aws: Aws) -> None:
    machine = waiting_machine(aws)
    uri = job(aws, "w-1")
    arn = start(aws, machine, "w-1", uri)
    deadline = time.monotonic() + 10
    the_worker = worker(aws, job_runner(Runner(), aws.traces))
    while not the_worker.poll_once():
        assert time.monotonic() < deadline, "no work message arrived"
    done = wait_for(aws, arn)
    assert done["status"] == "SUCCEEDED"
    output = ExecutionDone.model_validate_json(done["output"])
    report = RunReport.model_validate_json(aws.traces.get_bytes(output.report_uri))
    assert report.status == Status.SUCCEEDED and report.grading is not None
    assert output.started_at is not None and output.finished_at is not None
    assert 0 < output.finished_at - output.started_at < 10
    assert aws.messages(aws.work_queue) == []  # deleted after the callback


class FailureSpy:
    """The Step Functions client, keeping each SendTaskFailure's arguments."""

    def __init__(self, sfn: Any) -> None:
        self.sfn = sfn
        self.failures: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sfn, name)

    def send_task_failure(self, **kwargs: Any) -> Any:
        self.failures.append(kwargs)
        return self.sfn.send_task_failure(**kwargs)


def test_a_runner_failure_is_a_typed_task_failure(aws: Aws) -> None:
    machine = waiting_machine(aws)
    uri = job(aws, "w-2")
    arn = start(aws, machine, "w-2", uri)

    def broken(_: JobSpec, __: threading.Event) -> RunReport:
        raise RuntimeError("no sandbox here")

    the_worker = worker(aws, broken)
    the_worker.sfn = spy = FailureSpy(aws.sfn)
    deadline = time.monotonic() + 10
    while not the_worker.poll_once():
        assert time.monotonic() < deadline
    done = wait_for(aws, arn)
    assert done["status"] == "FAILED"
    assert done.get("error") == "Sandbox.Error"
    # The cause is the JSON the recorder reads: the message, and the attempt it ended.
    (failure,) = spy.failures
    cause = json.loads(failure["cause"])
    assert cause == {"errorMessage": "RuntimeError: no sandbox here", "attempt": 0}


def test_a_retried_job_reports_its_attempt(aws: Aws) -> None:
    machine = waiting_machine(aws, heartbeat_s=2, retries=2)
    arn = start(aws, machine, "w-9", job(aws, "w-9"))
    deadline = time.monotonic() + 15
    lost: list[dict[str, Any]] = []
    while not lost:  # a worker takes the first attempt and dies: its heartbeat lapses
        assert time.monotonic() < deadline, "no work message arrived"
        lost = aws.messages(aws.work_queue)
    assert json.loads(lost[0]["Body"])["attempt"] == 0
    the_worker = worker(aws, fake_report)
    while not the_worker.poll_once():  # the retry's message (the lost one is still invisible)
        assert time.monotonic() < deadline, "the retry never arrived"
    done = wait_for(aws, arn)
    assert done["status"] == "SUCCEEDED"
    assert ExecutionDone.model_validate_json(done["output"]).attempt == 1


def test_a_job_whose_execution_moved_on_is_dropped_unreported(aws: Aws) -> None:
    machine = waiting_machine(aws, heartbeat_s=1)
    uri = job(aws, "w-3")
    arn = start(aws, machine, "w-3", uri)
    deadline = time.monotonic() + 10
    messages: list[dict[str, Any]] = []
    while not messages:
        assert time.monotonic() < deadline
        messages = aws.messages(aws.work_queue)
    assert wait_for(aws, arn)["status"] == "FAILED"  # the heartbeat expired: the token is dead
    ran = threading.Event()

    def run(_: JobSpec) -> RunReport:
        ran.set()
        raise AssertionError("must not run")

    worker(aws, run).handle(messages[0])
    assert not ran.is_set()


class SlowTake:
    """An admission table whose `take` outlasts the Execute step's heartbeat (a throttled
    table under the client's retries, a stalled gateway), noting what is given back."""

    def __init__(self, arn: str, aws: Aws) -> None:
        self.arn, self.aws, self.given_back = arn, aws, []

    def take(self, request_id: str, worker: str) -> bool:
        assert wait_for(self.aws, self.arn)["status"] == "FAILED"  # its heartbeat lapsed
        return True

    def release(self, request_id: str, *, worker: str | None = None, held: object = None) -> bool:
        self.given_back.append(request_id)
        return True


def test_a_job_whose_execution_moved_on_while_its_slot_was_taken_is_dropped(aws: Aws) -> None:
    """Was a break (red team 24, R1): the worker beat once, then took its admission slot,
    and only then started beating. A take slower than the heartbeat let the Execute step
    lapse (and, no worker having taken it, send the job again): the job ran twice. It beats
    again once it holds the slot, and drops a job whose execution moved on."""
    machine = waiting_machine(aws, heartbeat_s=1)
    arn = start(aws, machine, "w-slow", job(aws, "w-slow"))
    deadline = time.monotonic() + 10
    messages: list[dict[str, Any]] = []
    while not messages:
        assert time.monotonic() < deadline
        messages = aws.messages(aws.work_queue)
    ran = threading.Event()

    def run(_: JobSpec) -> RunReport:
        ran.set()
        raise AssertionError("must not run")

    the_worker = worker(aws, run)
    the_worker.admission = slow = SlowTake(arn, aws)  # type: ignore[assignment]
    the_worker.handle(messages[0])
    assert not ran.is_set()
    assert slow.given_back == ["w-slow"]  # its slot, given back at once
    assert aws.messages(aws.work_queue) == []  # the stale message is gone


def test_a_job_taken_before_moto_set_its_task_up_runs(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a flake of a loaded suite (a stop test's job never started within 15 s): a worker
    that took a job's message as soon as it was sent beat before moto's execution thread,
    starved, had set the task up; moto answered InvalidToken and the worker dropped the job as
    stale. On AWS the token is live once the message is sent: the `aws` fixture carries the
    twin's patches of moto's early heartbeats and callbacks. Here the set-up is late on
    purpose, as a loaded machine makes it."""
    set_up = CallbackEndpoint.setup_heartbeat_endpoint

    def late(self: CallbackEndpoint, heartbeat_seconds: int) -> Any:
        time.sleep(1)
        return set_up(self, heartbeat_seconds)

    monkeypatch.setattr(CallbackEndpoint, "setup_heartbeat_endpoint", late)
    machine = waiting_machine(aws, heartbeat_s=5)
    arn = start(aws, machine, "w-early", job(aws, "w-early"))
    the_worker = worker(aws, fake_report)
    deadline = time.monotonic() + 10
    while not the_worker.poll_once():
        assert time.monotonic() < deadline, "no work message arrived"
    assert wait_for(aws, arn)["status"] == "SUCCEEDED"


def test_a_message_sent_during_a_long_poll_ends_it(aws: Aws) -> None:
    """Was a flake of a loaded suite: the tests' lock on moto's data stores (one call at a
    time) was held through a worker's long poll, so no message could be sent during one; each
    poll lasted its whole WaitTimeSeconds and the sender lost the lock to the next poll. A
    long poll now gives the lock up while it waits, and a message ends it, as on SQS."""
    polled: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        answer = aws.sqs.receive_message(QueueUrl=aws.work_queue, WaitTimeSeconds=20)
        polled.update(messages=len(answer.get("Messages", [])), s=time.monotonic() - started)

    polling = threading.Thread(target=poll)
    polling.start()
    time.sleep(0.5)  # the poll waits
    aws.sqs.send_message(QueueUrl=aws.work_queue, MessageBody="{}")
    polling.join(30)
    assert polled["messages"] == 1 and polled["s"] < 10, polled


def wait_until_started(aws: Aws, arn: str, started: threading.Event) -> None:
    """Until the job runs, however long a loaded machine takes to start it; a failure as soon
    as its execution ends first (the job was dropped: it never will)."""
    while not started.wait(0.1):
        status = aws.sfn.describe_execution(executionArn=arn)["status"]
        assert status == "RUNNING", f"the job never started: its execution is {status}"


def test_a_stop_request_finishes_the_current_job_and_loses_nothing(aws: Aws) -> None:
    machine = waiting_machine(aws)
    uri = job(aws, "w-4")
    arn = start(aws, machine, "w-4", uri)
    started, finished = threading.Event(), threading.Event()
    real = job_runner(Runner(), aws.traces)

    def slow(spec: JobSpec, stop: threading.Event) -> RunReport:
        started.set()
        time.sleep(1)  # SIGTERM arrives mid-job (the entrypoint's handler sets `stop`)
        try:
            return real(spec, stop)
        finally:
            finished.set()

    the_worker = worker(aws, slow)
    serving = threading.Thread(target=the_worker.serve)
    serving.start()
    try:
        wait_until_started(aws, arn, started)
        the_worker.stop.set()
        finished.wait()  # the job's own run, as long as the machine makes it
    finally:
        the_worker.stop.set()
        serving.join(timeout=STOPPED_S)
    assert not serving.is_alive()  # its job done, it answers and stops: no other poll
    assert wait_for(aws, arn)["status"] == "SUCCEEDED"


class FlakyStore:
    """The job store, except that every upload fails."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get_bytes(self, uri: str) -> bytes:
        return bytes(self.store.get_bytes(uri))

    def put_json(self, key: str, value: Any) -> str:
        raise OSError("S3 is unreachable")


def test_a_report_that_cannot_be_uploaded_is_a_typed_failure(aws: Aws) -> None:
    machine = waiting_machine(aws)
    arn = start(aws, machine, "w-5", job(aws, "w-5"))
    the_worker = worker(aws, job_runner(Runner(), aws.traces))
    the_worker.jobs = FlakyStore(aws.traces)  # type: ignore[assignment]
    deadline = time.monotonic() + 10
    while not the_worker.poll_once():
        assert time.monotonic() < deadline
    done = wait_for(aws, arn)
    assert (done["status"], done.get("error")) == ("FAILED", "Sandbox.Error")


def test_a_failing_aws_call_does_not_end_the_worker_loop(aws: Aws) -> None:
    machine = waiting_machine(aws)
    the_worker = worker(aws, job_runner(Runner(), aws.traces))
    polls = 0
    real_receive = aws.sqs.receive_message

    class OnceBrokenSqs:
        def __getattr__(self, name: str) -> Any:
            return getattr(aws.sqs, name)

        def receive_message(self, **kwargs: Any) -> Any:
            nonlocal polls
            polls += 1
            if polls == 1:
                raise ConnectionError("the queue endpoint is down")
            return real_receive(**kwargs)

    the_worker.sqs = OnceBrokenSqs()
    serving = threading.Thread(target=the_worker.serve)
    serving.start()
    arn = start(aws, machine, "w-6", job(aws, "w-6"))
    try:
        assert wait_for(aws, arn)["status"] == "SUCCEEDED"
    finally:
        the_worker.stop.set()
        serving.join(timeout=30)
    assert polls > 1


def test_a_worker_told_to_stop_hands_a_long_job_back_after_its_grace(aws: Aws) -> None:
    machine = waiting_machine(aws)
    arn = start(aws, machine, "w-7", job(aws, "w-7"))
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = job_runner(Runner(), aws.traces)

    def long_job(spec: JobSpec, stop: threading.Event) -> RunReport:
        started.set()
        release.wait(30)  # still running when the grace ends
        try:
            return real(spec, stop)
        finally:
            finished.set()

    the_worker = worker(aws, long_job)
    serving = threading.Thread(target=the_worker.serve)
    serving.start()
    try:
        wait_until_started(aws, arn, started)
        the_worker.shut_down(grace_s=0.5)  # what SIGTERM does in the Fargate entrypoint
        # Handed back at the first heartbeat tick (1 s) past the grace.
        done = wait_for(aws, arn, timeout_s=STOPPED_S)
        assert (done["status"], done.get("error")) == ("FAILED", "Sandbox.Interrupted")
    finally:
        release.set()
        if started.is_set():
            finished.wait()  # the job's own end: its result is dropped
        serving.join(timeout=STOPPED_S)
    assert not serving.is_alive()
    assert aws.traces.s3.list_objects_v2(Bucket="traces", Prefix="jobs/w-7/report")["KeyCount"] == 0


def test_a_job_received_after_the_stop_is_given_back_unrun(aws: Aws) -> None:
    machine = waiting_machine(aws)
    arn = start(aws, machine, "w-8", job(aws, "w-8"))
    ran = threading.Event()

    def run(spec: JobSpec) -> RunReport:
        ran.set()
        raise AssertionError("must not run")

    the_worker = worker(aws, run)
    the_worker.shut_down(grace_s=60)  # SIGTERM arrived during the long poll
    deadline = time.monotonic() + 10
    while not the_worker.poll_once():
        assert time.monotonic() < deadline
    assert not ran.is_set()
    (message,) = aws.messages(aws.work_queue)  # visible again at once, for another worker
    assert json.loads(message["Body"])["request_id"] == "w-8"
    assert aws.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"
    the_worker.shut_down(grace_s=3600)
    assert the_worker.hand_back_at is not None and the_worker.hand_back_at < time.time() + 61


def fake_report(job: JobSpec, stop: threading.Event) -> RunReport:
    return RunReport(
        task_id=job.task.task_id,
        sample_id=job.request_id,
        status=Status.SUCCEEDED,
        commands=[],
        grading=None,
        provenance=None,
    )


def serve_until_stopped(the_worker: Worker, timeout_s: float = 30) -> None:
    thread = threading.Thread(target=the_worker.serve, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the worker should have stopped on its own"


def recycling_worker(
    aws: Aws, prefix: str, jobs: int, recycle: int, residue: Callable[[], list[str]]
) -> tuple[Worker, list[str]]:
    """`jobs` queued jobs, and a worker with these settings served until it stops itself."""
    machine = waiting_machine(aws)
    arns = [start(aws, machine, f"{prefix}-{i}", job(aws, f"{prefix}-{i}")) for i in range(jobs)]
    queued_s = time.monotonic() + 10  # moto runs each execution on a thread of its own
    while queued(aws) < jobs:
        assert time.monotonic() < queued_s, f"{jobs} executions did not queue their jobs"
        time.sleep(0.05)
    the_worker = worker(aws, fake_report)
    the_worker.recycle_after_jobs = recycle
    the_worker.residue = residue
    serve_until_stopped(the_worker)
    return the_worker, arns


def queued(aws: Aws) -> int:
    """The work queue's messages, visible or not (no receive: none is taken)."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    found = aws.sqs.get_queue_attributes(QueueUrl=aws.work_queue, AttributeNames=names)
    return sum(int(found["Attributes"][name]) for name in names)


def test_a_worker_exits_after_recycle_after_jobs_and_leaves_the_rest_queued(aws: Aws) -> None:
    the_worker, arns = recycling_worker(aws, "rc", 3, 2, list)  # list: nothing left behind
    assert the_worker.jobs_done == 2
    deadline = time.monotonic() + 10  # the callbacks end their executions asynchronously
    while sum(map(bool, _statuses(aws, arns))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(_statuses(aws, arns)) == ["", "SUCCEEDED", "SUCCEEDED"]
    assert len(aws.messages(aws.work_queue)) == 1  # the third waits for a fresh worker


def test_a_worker_whose_wipe_left_anything_takes_no_further_job(aws: Aws) -> None:
    the_worker, _ = recycling_worker(aws, "rs", 2, 100, lambda: ["file /tmp/left-by-a-job"])
    assert the_worker.jobs_done == 1
    assert len(aws.messages(aws.work_queue)) == 1


def _statuses(aws: Aws, arns: list[str]) -> list[str]:
    """Each execution's final status, or "" while it runs."""
    found = [str(aws.sfn.describe_execution(executionArn=arn)["status"]) for arn in arns]
    return ["" if status == "RUNNING" else status for status in found]


def test_a_residue_check_that_fails_counts_as_residue(aws: Aws) -> None:
    def broken() -> list[str]:
        raise OSError("cannot read /proc")

    the_worker, _ = recycling_worker(aws, "rf", 2, 100, broken)
    assert the_worker.jobs_done == 1


def test_a_checkpoint_is_stored_by_its_hash_and_a_corrupt_one_is_a_sandbox_failure(
    aws: Aws,
) -> None:
    run = job_runner(Runner(), aws.traces)
    task = Task.model_validate(ADD_TASK)
    first = JobSpec(request_id="c-1", task=task, grade=False, checkpoint=True,
                    commands=[["touch", "left.txt"]], limits=task.limits)  # fmt: skip
    checkpoint = run(first, threading.Event()).checkpoint
    assert checkpoint is not None
    stored = aws.traces.get_bytes(aws.traces.uri(keys.checkpoint_key(checkpoint)))
    assert keys.sha256_hex(stored) == checkpoint
    second = first.model_copy(update={"base_checkpoint": checkpoint, "checkpoint": False,
                                      "commands": [["test", "-e", "left.txt"]]})  # fmt: skip
    report = run(second, threading.Event())
    assert report.commands[0].exit_code == 0 and report.checkpoint is None
    aws.traces.put_bytes(keys.checkpoint_key(checkpoint), stored[:-1], "application/gzip")
    with pytest.raises(SandboxError, match="does not match its sha256"):
        run(second, threading.Event())


def test_a_work_message_is_read_by_its_type_not_by_its_first_characters(
    aws: Aws, caplog: pytest.LogCaptureFixture
) -> None:
    """Was a gap (issue 24's review): the worker routed a message by '"session"' in its first
    20 characters, so a message with leading whitespace was taken for the wrong kind. Now the
    message is parsed as one of the work queue's two types (a session open is neither: opens
    have a queue of their own); what is neither is dropped, and says so."""
    batched = " " * 30 + json.dumps(
        {"batch_id": "b" * 32, "request_id": "r-1", "job_uri": "s3://t/j", "budget_s": 5}
    )
    limits = Task.model_validate(ADD_TASK).limits.model_dump()
    spec = {
        "session_id": "a" * 32, "task_id": "add", "limits": limits,
        "expires_at": time.time() + 60, "idle_release_s": 30.0,
        "reply_url": "https://sqs/out",
    }  # fmt: skip
    the_worker = worker(aws, job_runner(Runner(), aws.traces))  # it runs no batched job
    with caplog.at_level(logging.ERROR, logger="trialbox.worker"):
        for body in (batched, json.dumps({"session": spec}), '{"neither": 1}'):
            aws.sqs.send_message(QueueUrl=aws.work_queue, MessageBody=body)
            assert the_worker.poll_once()
    said = [r.getMessage()[:40] for r in caplog.records]
    assert said == [
        "dropping a batched job: this worker runs",
        "dropping a work message that is not a jo",
        "dropping a work message that is not a jo",
    ]
    assert aws.messages(aws.work_queue) == []
