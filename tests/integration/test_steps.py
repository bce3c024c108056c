"""Prepare, Score and Record under moto, with a real sandbox run in between."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.errors import RequestRejected
from trialbox.keys import taskset_key
from trialbox.models import ExecutionRequest, ExecutionResult, Status
from trialbox.models.jobs import ExecutionDone, JobSpec, RolloutInput, StepError
from trialbox.models.performance import copy_s
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import Recorded, Recorder, RecordInput
from trialbox.sandbox.runner import Runner


def rollout(**fields: object) -> RolloutInput:
    body = {"request_id": "r-1", "task": ADD_TASK, "files": {"solution.py": CORRECT}} | fields
    request = ExecutionRequest.model_validate(body)
    return RolloutInput(request_id=request.request_id, request=request)


def test_prepare_writes_the_job_and_sizes_the_token_timeout(aws: Aws, preparer: Preparer) -> None:
    ref = preparer(
        rollout(commands=[["true"], ["true"]], limits={"timeout_s": 3, "memory_mb": 9999})
    )
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    assert job.limits.timeout_s == 3 and job.limits.memory_mb == 512  # only tightened
    run = 2 * 3 + 3 + 2 * copy_s(job.limits.disk_mb)  # commands, grading, its two copies
    assert (ref.timeout_s, ref.heartbeat_s) == (30 + math.ceil(run) + 60, 30)  # wait+run+margin
    assert ref.job_uri == "s3://traces/jobs/r-1/job.json"


def test_prepare_resolves_a_task_ref_from_the_task_set(aws: Aws, preparer: Preparer) -> None:
    line = json.dumps(ADD_TASK | {"task_id": "group/add"})
    aws.s3.put_object(Bucket="tasksets", Key=taskset_key("demo", "abc"), Body=line.encode())
    body = {"request_id": "r-2", "task_ref": "demo@abc/group/add"}
    request = ExecutionRequest.model_validate(body)
    ref = preparer(RolloutInput(request_id="r-2", request=request))
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    assert job.task.task_id == "group/add" and job.taskset_sha256 == "abc"


@pytest.mark.parametrize(
    ("task_ref", "message"),
    [
        ("nope@v1/add-two", "task_ref: task set nope@v1 not found"),
        ("demo@abc/missing", "task_ref: no task 'missing' in demo@abc"),
    ],
)
def test_prepare_rejects_what_cannot_be_found(
    aws: Aws, preparer: Preparer, task_ref: str, message: str
) -> None:
    aws.s3.put_object(
        Bucket="tasksets", Key=taskset_key("demo", "abc"), Body=json.dumps(ADD_TASK).encode()
    )
    request = ExecutionRequest.model_validate({"request_id": "r-3", "task_ref": task_ref})
    with pytest.raises(RequestRejected, match=message):
        preparer(RolloutInput(request_id="r-3", request=request))


def test_prepare_reads_a_task_set_once_per_warm_function(
    aws: Aws, preparer: Preparer, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [json.dumps(ADD_TASK | {"task_id": f"t{i}"}) for i in range(3)]
    aws.s3.put_object(Bucket="tasksets", Key=taskset_key("big", "v1"), Body="\n".join(lines))
    reads: list[str] = []
    original = aws.tasksets.get_bytes
    monkeypatch.setattr(aws.tasksets, "get_bytes", lambda uri: reads.append(uri) or original(uri))
    for i in range(3):
        body = {"request_id": f"r-c{i}", "task_ref": f"big@v1/t{i}"}
        request = ExecutionRequest.model_validate(body)
        preparer(RolloutInput(request_id=f"r-c{i}", request=request))
    assert reads == ["s3://tasksets/tasksets/big@v1.jsonl"]


@pytest.mark.parametrize("bad", ["{not json", "[" * 100_000 + "]" * 100_000])  # too deep too
def test_prepare_rejects_a_task_set_with_a_line_that_is_not_json(
    aws: Aws, preparer: Preparer, bad: str
) -> None:
    body = json.dumps(ADD_TASK) + "\n" + bad + "\n"
    aws.s3.put_object(Bucket="tasksets", Key=taskset_key("broken", "v1"), Body=body)
    request = ExecutionRequest.model_validate({"request_id": "r-b", "task_ref": "broken@v1/x"})
    with pytest.raises(RequestRejected, match="task set broken@v1: line 2 is not JSON"):
        preparer(RolloutInput(request_id="r-b", request=request))


def test_record_scores_what_the_worker_answered_exactly_once(aws: Aws, preparer: Preparer) -> None:
    """Record scores the run Execute answered (its job and the worker's report) and records
    it, in one step: nothing passes through S3 between scoring and recording."""
    ref = preparer(rollout())
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    report = Runner().run(job.task, job.sample(), limits=job.limits)
    report_uri = aws.traces.put_json("jobs/r-1/report.json", report)
    done = ExecutionDone(report_uri=report_uri, started_at=job.queued_at, finished_at=2e9)
    recorder = Recorder(aws.table, aws.traces, aws.admission)
    state = RecordInput(request_id="r-1", job=ref.model_dump(), execution=done.model_dump())
    assert recorder(state).written is True
    assert recorder(state).written is False  # the first terminal write wins
    item = aws.item("r-1")
    assert item is not None
    assert (item["status"], item["reward"]) == ({"S": "succeeded"}, {"N": "1.0"})
    assert item["result_uri"] == {"S": "s3://traces/traces/r-1.json"}
    trace = json.loads(aws.traces.get_bytes("s3://traces/traces/r-1.json"))
    assert trace["result"]["tests_passed"] == 2 and trace["state"]["job"]["job_uri"] == ref.job_uri
    timings = ExecutionResult.model_validate(trace["result"]).timings
    assert timings.queued_at == job.queued_at and timings.queued_at is not None
    assert (timings.started_at, timings.finished_at) == (job.queued_at, 2e9)
    listed = aws.s3.list_objects_v2(Bucket="traces", Prefix="jobs/r-1/")["Contents"]
    assert sorted(o["Key"] for o in listed) == ["jobs/r-1/job.json", "jobs/r-1/report.json"]


def test_the_scored_result_counts_the_execute_attempts(aws: Aws, preparer: Preparer) -> None:
    ref = preparer(rollout(request_id="r-a"))
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    report = Runner().run(job.task, job.sample(), limits=job.limits)
    report_uri = aws.traces.put_json("jobs/r-a/report.json", report)
    done = ExecutionDone(report_uri=report_uri, attempt=2)  # two lost sandboxes before this one
    state = RecordInput(request_id="r-a", job=ref.model_dump(), execution=done.model_dump())
    assert Recorder(aws.table, aws.traces, aws.admission)(state).written
    item = aws.item("r-a")
    assert item is not None
    result = json.loads(item["result"]["S"])
    assert (result["status"], result["attempts"]) == ("succeeded", 3)


def test_a_retry_that_answered_is_scored_though_the_lost_attempt_left_its_error(
    aws: Aws, preparer: Preparer
) -> None:
    """A lapsed attempt's catch writes `$.error`; the retry's answer (`$.execution`) comes
    after it in the same state, and it is what Record scores."""
    ref = preparer(rollout(request_id="r-r"))
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    report = Runner().run(job.task, job.sample(), limits=job.limits)
    done = ExecutionDone(report_uri=aws.traces.put_json("jobs/r-r/report.json", report), attempt=1)
    lapsed = StepError(Error="States.HeartbeatTimeout")
    state = RecordInput(
        request_id="r-r", job=ref.model_dump(), error=lapsed, execution=done.model_dump()
    )
    assert Recorder(aws.table, aws.traces, aws.admission)(state).written
    item = aws.item("r-r")
    assert item is not None
    result = json.loads(item["result"]["S"])
    assert (result["status"], result["reward"], result["attempts"]) == ("succeeded", 1.0, 2)


class Throttled:
    """A traces store whose reads fail for now (S3's SlowDown past botocore's retries)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get_bytes(self, uri: str) -> bytes:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "slow down"}}, "GetObject")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_read_that_failed_for_now_is_record_s_retry_not_a_result(
    aws: Aws, preparer: Preparer
) -> None:
    """Red team: a throttled read of the job or the report was scored Score.Failed, a
    sandbox_error for a good run, and Record's retries never ran. It raises: Record's retry
    (or the finish message's redelivery) scores the run again."""
    ref = preparer(rollout(request_id="r-t"))
    done = ExecutionDone(report_uri="s3://traces/jobs/r-t/report.json", worker="w-1")
    state = RecordInput(request_id="r-t", job=ref.model_dump(), execution=done.model_dump())
    with pytest.raises(ClientError, match="SlowDown"):
        Recorder(aws.table, Throttled(aws.traces), aws.admission)(state)  # type: ignore[arg-type]
    assert aws.item("r-t") is None


@pytest.mark.parametrize(
    "answer",
    [
        {"report_uri": "s3://traces/jobs/r-s/nothing.json", "worker": "w-1"},  # no report there
        {"worker": "w-1"},  # no report_uri: not an answer a worker of this stack sends
    ],
)
def test_a_run_that_cannot_be_scored_ends_as_a_score_failure(
    aws: Aws, preparer: Preparer, answer: dict[str, Any]
) -> None:
    ref = preparer(rollout(request_id="r-s"))
    state = RecordInput(request_id="r-s", job=ref.model_dump(), execution=answer)
    assert Recorder(aws.table, aws.traces, aws.admission)(state).written
    item = aws.item("r-s")
    assert item is not None
    result = ExecutionResult.model_validate_json(item["result"]["S"])
    assert (result.status, result.loss_mask) == (Status.SANDBOX_ERROR, True)
    assert result.error is not None and result.error.startswith("Score.Failed: ")


@pytest.mark.parametrize(
    ("error", "cause", "status", "message", "attempts"),
    [
        (
            "RequestRejected",
            json.dumps(
                {"errorMessage": "task_ref: task set x@1 not found", "errorType": "RequestRejected"}
            ),
            "rejected",
            "task_ref: task set x@1 not found",
            1,
        ),
        (
            "Sandbox.Error",
            "bwrap failed to start",
            "sandbox_error",
            "Sandbox.Error: bwrap failed to start",
            1,
        ),
        (  # the worker's cause: the runner failed on the attempt after one lost sandbox
            "Sandbox.Error",
            json.dumps({"errorMessage": "bwrap failed to start", "attempt": 1}),
            "sandbox_error",
            "Sandbox.Error: bwrap failed to start",
            2,
        ),
        # A lost sandbox reaches Record only once the Execute retries (2) are exhausted.
        ("States.Timeout", None, "sandbox_error", "States.Timeout", 3),
        (
            "States.HeartbeatTimeout",
            None,
            "sandbox_error",
            "States.HeartbeatTimeout",
            3,
        ),
        (
            "Sandbox.Interrupted",
            "the worker was stopped",
            "sandbox_error",
            "Sandbox.Interrupted: the worker was stopped",
            3,
        ),
    ],
)
def test_failures_are_recorded_with_their_error_class(
    aws: Aws, error: str, cause: str | None, status: str, message: str, attempts: int
) -> None:
    state = RecordInput(request_id="r-9", error=StepError(Error=error, Cause=cause))
    assert Recorder(aws.table, aws.traces, aws.admission)(state) == Recorded(
        written=True, status=Status(status)
    )
    item = aws.item("r-9")
    assert item is not None and item["status"] == {"S": status}
    assert item["loss_mask"] == {"BOOL": True} and "reward" not in item
    result = json.loads(item["result"]["S"])
    assert (result["error"], result["attempts"]) == (message, attempts)
