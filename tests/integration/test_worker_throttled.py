"""The worker when Step Functions throttles or fails its callbacks past botocore's retries: a
finished run is answered, never run again as a lost sandbox."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from botocore.exceptions import ClientError

from tests.integration.test_worker import waiting_machine
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK
from trialbox.models import RunReport, Status, Task
from trialbox.models.jobs import ExecutionDone, JobSpec
from trialbox.worker.loop import Worker

HEARTBEAT_S = 6  # room for a loaded machine: the answer is retried within it


def execute_machine(aws: Aws) -> str:
    """Execute as the stack has it: a lost sandbox (a lapsed heartbeat) is retried."""
    return waiting_machine(aws, HEARTBEAT_S, retries=2)


def throttled(operation: str) -> ClientError:
    """What botocore raises once its retries of a throttled call are spent."""
    error = {"Code": "ThrottlingException", "Message": "Rate exceeded"}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)


class Throttling:
    """The Step Functions client, failing `calls` (by method name) the first `times` times."""

    def __init__(self, sfn: Any, calls: tuple[str, ...], times: int) -> None:
        self.sfn = sfn
        self.left = dict.fromkeys(calls, times)
        self.refused: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.sfn, name)
        if name not in self.left:
            return method

        def call(**kwargs: Any) -> Any:
            if self.left[name] > 0:
                self.left[name] -= 1
                self.refused.append(name)
                raise throttled(name)
            return method(**kwargs)

        return call


def run_one(
    aws: Aws, request_id: str, sfn: Any, broken: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """One job through a serving worker whose Step Functions client is `sfn` (and whose
    runner fails, if `broken`): the finished execution, and the sandbox runs' request ids."""
    spec = JobSpec(
        request_id=request_id,
        task=Task.model_validate(ADD_TASK),
        files={"solution.py": "def add(a, b):\n    return a + b\n"},
        limits=Task.model_validate(ADD_TASK).limits,
    )
    uri = aws.traces.put_json(f"jobs/{request_id}/job.json", spec)
    payload = json.dumps({"request_id": request_id, "job_uri": uri})
    runs: list[str] = []

    def run_job(job: JobSpec, stop: threading.Event) -> RunReport:
        runs.append(job.request_id)
        if broken:
            raise RuntimeError("no sandbox here")
        return RunReport(
            task_id=job.task.task_id,
            sample_id=job.request_id,
            status=Status.SUCCEEDED,
            commands=[],
            grading=None,
            provenance=None,
        )

    worker = Worker(aws.sqs, sfn, aws.traces, aws.work_queue, run_job, HEARTBEAT_S, wait_s=1)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()  # polling before the job is sent: its first attempt is the one taken
    started = aws.sfn.start_execution(
        stateMachineArn=execute_machine(aws), name=request_id, input=payload
    )
    deadline = time.monotonic() + 40
    try:
        while True:
            done = aws.sfn.describe_execution(executionArn=started["executionArn"])
            if done["status"] != "RUNNING":
                return dict(done), runs
            assert time.monotonic() < deadline, "the execution did not finish"
            time.sleep(0.1)
    finally:
        worker.stop.set()
        thread.join(5)


def test_a_callback_throttled_past_its_retries_is_answered_and_not_run_again(aws: Aws) -> None:
    # SendTaskSuccess fails twice in a row, each time after botocore's own retries.
    sfn = Throttling(aws.sfn, ("send_task_success",), times=2)
    done, runs = run_one(aws, "throttled-success", sfn)
    assert sfn.refused == ["send_task_success", "send_task_success"]
    assert done["status"] == "SUCCEEDED"
    assert runs == ["throttled-success"]  # one sandbox run, not a lost-sandbox retry
    assert ExecutionDone.model_validate_json(done["output"]).attempt == 0
    assert aws.messages(aws.work_queue) == []


def test_a_throttled_failure_callback_is_answered_too(aws: Aws) -> None:
    sfn = Throttling(aws.sfn, ("send_task_failure",), times=2)
    done, runs = run_one(aws, "throttled-failure", sfn, broken=True)
    assert sfn.refused == ["send_task_failure", "send_task_failure"]
    assert (done["status"], done.get("error")) == ("FAILED", "Sandbox.Error")
    assert runs == ["throttled-failure"]  # answered by its one run, not retried as lost
