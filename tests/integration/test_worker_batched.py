"""A worker running batched samples under moto, with real sandboxes: each sample claimed, run
once and finished, however many workers see its message; a sample whose holder died taken
over as a lost sandbox; a cancelled one never run; and the batch's execution ends with its
last result."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_batch_ledger import started
from tests.integration.test_batch_prepare import batch
from tests.integration.test_worker import wait_for
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.models import ExecutionRequest, ExecutionResult, Status
from trialbox.models.batches import BatchWork, Finished
from trialbox.pipeline.batch_prepare import BatchPreparer
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.claims import Claim, Claims
from trialbox.pipeline.finish import Finisher
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import Recorder
from trialbox.sandbox.runner import Runner
from trialbox.worker.batched import BatchedJobs
from trialbox.worker.loop import Worker
from trialbox.worker.run import job_runner

HEARTBEAT_S = 3
LEASE_S = 2 * HEARTBEAT_S


class Pipeline:
    """The batch's Run step, a worker, and the finisher, on one moto account."""

    def __init__(self, aws: Aws, preparer: Preparer) -> None:
        self.aws = aws
        self.finish_queue = aws.sqs.create_queue(QueueName="finish")["QueueUrl"]
        self.claims = Claims(aws.dynamodb, aws.admission.table, LEASE_S)
        recorder = Recorder(aws.table, aws.traces, aws.admission)
        ledger = Ledger(aws.dynamodb, aws.sfn, aws.admission.table)
        self.run_step = BatchPreparer(
            preparer, recorder, ledger, aws.traces, aws.sqs, aws.work_queue
        )
        self.finisher = Finisher(recorder, ledger)

    def worker(self, name: str) -> Worker:
        batched = BatchedJobs(
            self.aws.sqs, self.aws.work_queue, self.finish_queue, self.claims, HEARTBEAT_S, name
        )
        run = job_runner(Runner(), self.aws.traces)
        return Worker(
            self.aws.sqs,
            self.aws.sfn,
            self.aws.traces,
            self.aws.work_queue,
            run,
            heartbeat_s=HEARTBEAT_S,
            name=name,
            wait_s=1,
            batched=batched,
        )

    def start(self, batch_id: str, requests: list[ExecutionRequest]) -> str:
        for request in requests:
            assert self.aws.admission.admit(request.request_id)
        execution, token = started(self.aws, batch_id)
        self.run_step(batch(self.aws, batch_id, requests), token)
        return execution

    def finish_all(self) -> list[Finished]:
        finished = []
        for message in self.aws.messages(self.finish_queue):
            done = Finished.model_validate_json(message["Body"])
            self.finisher(done)
            finished.append(done)
            self.aws.sqs.delete_message(
                QueueUrl=self.finish_queue, ReceiptHandle=message["ReceiptHandle"]
            )
        return finished

    def result(self, request_id: str) -> ExecutionResult:
        item = self.aws.item(request_id)
        assert item is not None, f"{request_id} has no result"
        return ExecutionResult.model_validate_json(item["result"]["S"])


@pytest.fixture
def pipeline(aws: Aws, preparer: Preparer) -> Pipeline:
    return Pipeline(aws, preparer)


def reports(aws: Aws, request_id: str) -> int:
    listed = aws.s3.list_objects_v2(Bucket="traces", Prefix=f"jobs/{request_id}/report")
    return int(listed["KeyCount"])


def sample(request_id: str) -> ExecutionRequest:
    return ExecutionRequest.model_validate(
        {"request_id": request_id, "task": ADD_TASK, "files": {"solution.py": CORRECT}}
    )


def test_each_sample_runs_once_and_the_last_result_ends_the_batch(
    aws: Aws, pipeline: Pipeline
) -> None:
    execution = pipeline.start("b-1", [sample("s-1"), sample("s-2")])
    first, second = pipeline.worker("w-1"), pipeline.worker("w-2")
    ran = [first.poll_once(), second.poll_once()]
    assert ran == [True, True]
    assert aws.messages(aws.work_queue) == []  # each deleted once finished
    finished = pipeline.finish_all()
    assert sorted((f.request_id, f.outcome, f.attempt) for f in finished) == [
        ("s-1", "report", 0),
        ("s-2", "report", 0),
    ]
    for rid in ("s-1", "s-2"):
        result = pipeline.result(rid)
        assert (result.status, result.reward, result.attempts) == (Status.SUCCEEDED, 1.0, 1)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"
    assert aws.admission.in_flight() == 0


def test_a_sample_whose_holder_died_is_taken_over_as_a_lost_sandbox(
    aws: Aws, pipeline: Pipeline
) -> None:
    execution = pipeline.start("b-dead", [sample("s-dead")])
    dead = pipeline.claims.claim("s-dead", "w-dead", 600, now=time.time() - LEASE_S - 1)
    assert dead == Claim("s-dead", "w-dead", 0)  # its lease lapsed a second ago
    assert pipeline.worker("w-2").poll_once()
    (finished,) = pipeline.finish_all()
    assert (finished.worker, finished.attempt) == ("w-2", 1)
    result = pipeline.result("s-dead")
    assert (result.status, result.attempts) == (Status.SUCCEEDED, 2)
    assert not pipeline.claims.renew(dead)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"


def test_a_sample_held_alive_elsewhere_is_left_for_its_holder(aws: Aws, pipeline: Pipeline) -> None:
    pipeline.start("b-held", [sample("s-held")])
    assert isinstance(pipeline.claims.claim("s-held", "w-busy", 600), Claim)
    assert pipeline.worker("w-2").poll_once()  # received, and left alone
    assert pipeline.finish_all() == [] and aws.item("s-held") is None
    assert reports(aws, "s-held") == 0


def test_a_cancelled_sample_is_never_run_and_its_batch_still_ends(
    aws: Aws, pipeline: Pipeline
) -> None:
    execution = pipeline.start("b-cancel", [sample("s-cancel")])
    assert pipeline.claims.cancel("s-cancel")
    assert pipeline.worker("w-1").poll_once()
    (finished,) = pipeline.finish_all()
    assert (finished.outcome, finished.error, finished.cause) == ("not_run", None, "cancelled")
    assert (
        aws.traces.s3.list_objects_v2(Bucket="traces", Prefix="jobs/s-cancel/report")["KeyCount"]
        == 0
    )  # never run
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"
    assert aws.admission.in_flight() == 0


def test_a_copy_of_a_finished_samples_message_does_not_run_it_again(
    aws: Aws, pipeline: Pipeline
) -> None:
    """Was a hole (H2): a Run retried (or two batches) sends a sample's message twice; the
    copy, received after the holder finished but before the finisher recorded it, ran it
    again. Its worker now tells the finisher the sample is accounted for instead."""
    pipeline.start("b-twice", [sample("s-twice")])
    (message,) = aws.messages(aws.work_queue)
    aws.sqs.send_message(QueueUrl=aws.work_queue, MessageBody=message["Body"])
    aws.sqs.change_message_visibility(
        QueueUrl=aws.work_queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    assert pipeline.worker("w-1").poll_once()
    time.sleep(LEASE_S + 1)  # the finisher is behind by more than a lease
    assert pipeline.worker("w-2").poll_once()
    outcomes = {(f.worker, f.outcome, f.cause) for f in pipeline.finish_all()}
    assert outcomes == {(None, "not_run", "finished"), ("w-1", "report", None)}
    assert reports(aws, "s-twice") == 1


def test_a_sample_cancelled_mid_run_gives_its_slot_back_and_its_batch_ends(
    aws: Aws, pipeline: Pipeline
) -> None:
    """Was a hole (H1): a run whose claim was cancelled was dropped with no word to the
    finisher: its slot leaked and its batch waited for its Run's timeout."""
    execution = pipeline.start("b-mid", [sample("s-mid")])
    worker = pipeline.worker("w-1")
    assert worker.batched is not None
    original = worker._run

    def cancelled_while_running(job_uri: str, request_id: str, lost: object) -> tuple[str, str]:
        assert pipeline.claims.cancel(request_id)
        return original(job_uri, request_id, lost)  # type: ignore[arg-type]

    worker._run = cancelled_while_running  # type: ignore[method-assign]
    assert worker.poll_once()
    (finished,) = pipeline.finish_all()
    assert (finished.outcome, finished.cause, finished.worker) == ("not_run", "cancelled", "w-1")
    assert aws.admission.in_flight() == 0
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"


def test_a_run_past_its_deadline_is_given_up_to_a_retry_at_once(
    aws: Aws, pipeline: Pipeline
) -> None:
    """Was a hole (H1): a run past its deadline was dropped and its message deleted, so the
    sample waited for its batch's timeout. It is given up now: the next worker takes it over
    at once, as a lost sandbox (Execute's TimeoutSeconds did the same)."""
    pipeline.start("b-late", [sample("s-late")])
    (message,) = aws.messages(aws.work_queue)
    work = BatchWork.model_validate_json(message["Body"])
    aws.sqs.change_message_visibility(
        QueueUrl=aws.work_queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    late = work.model_copy(update={"budget_s": 1})
    first = pipeline.worker("w-1")
    assert first.batched is not None
    original = first._run

    def slow(job_uri: str, request_id: str, lost: object) -> tuple[str, str]:
        time.sleep(1.5)  # past its 1 s budget
        return original(job_uri, request_id, lost)  # type: ignore[arg-type]

    received = aws.sqs.receive_message(QueueUrl=aws.work_queue, VisibilityTimeout=60)
    (again,) = received["Messages"]
    assert first.batched.handle(late, again["ReceiptHandle"], slow)
    assert pipeline.finish_all() == []  # no report from the run past its deadline
    assert pipeline.worker("w-2").poll_once()  # visible again at once, taken over
    (finished,) = pipeline.finish_all()
    assert (finished.worker, finished.outcome, finished.attempt) == ("w-2", "report", 1)
