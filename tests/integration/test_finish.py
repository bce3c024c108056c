"""The finisher under moto, after a real sandbox run: a batched sample is scored and recorded
once, however often its finish message comes; its holder's slot goes back; and its batch's
execution ends with its last sample."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_batch_ledger import started
from tests.integration.test_steps import rollout
from tests.integration.test_worker import wait_for
from tests.support.moto import Aws
from trialbox.constants import ERROR_LOST
from trialbox.models import Status
from trialbox.models.batches import Finished
from trialbox.models.jobs import JobSpec
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.claims import Claim, Claims
from trialbox.pipeline.finish import Finisher
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import Recorder
from trialbox.sandbox.runner import Runner


@pytest.fixture
def finisher(aws: Aws) -> Finisher:
    ledger = Ledger(aws.dynamodb, aws.sfn, aws.admission.table)
    return Finisher(Recorder(aws.table, aws.traces, aws.admission), ledger)


def ran(aws: Aws, preparer: Preparer, request_id: str) -> Finished:
    """A real run of the add task's right answer, claimed by w-1, as the worker reports it."""
    ref = preparer(rollout(request_id=request_id))
    job = JobSpec.model_validate_json(aws.traces.get_bytes(ref.job_uri))
    report = Runner().run(job.task, job.sample(), limits=job.limits)
    assert aws.admission.admit(request_id)
    claim = Claims(aws.dynamodb, aws.admission.table, 30).claim(request_id, "w-1", 600)
    assert claim == Claim(request_id, "w-1", 0)
    return Finished(
        batch_id="b-1",
        request_id=request_id,
        job_uri=ref.job_uri,
        outcome="report",
        report_uri=aws.traces.put_json(f"jobs/{request_id}/report.json", report),
        worker="w-1",
        started_at=1.0,
        finished_at=2.0,
        content_sha256="c" * 64,
    )


def test_a_sample_is_scored_and_recorded_once_and_ends_its_batch(
    aws: Aws,
    finisher: Finisher,
    preparer: Preparer,
) -> None:
    execution, token = started(aws, "b-1")
    finisher.ledger.open("b-1", 2, token)
    done = ran(aws, preparer, "r-1")
    recorded = finisher(done)
    assert recorded is not None and (recorded.written, recorded.status) == (True, Status.SUCCEEDED)
    again = finisher(done)  # the message came twice
    assert again is not None and again.written is False
    item = aws.item("r-1")
    assert item is not None and (item["status"], item["reward"]) == (
        {"S": "succeeded"},
        {"N": "1.0"},
    )
    # Its content, for the SDK's check of a reused id (a batch's result, as a Rollout's).
    assert aws.table.terminal("r-1") == (True, "c" * 64)
    assert aws.admission.in_flight() == 0  # the holder's slot went back with the result
    assert aws.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"

    lost = Finished(
        batch_id="b-1",
        request_id="r-2",
        job_uri="s3://traces/jobs/r-2/job.json",
        outcome="not_run",
        error=ERROR_LOST,
        cause="its worker was lost 3 times",
        attempt=2,
    )
    recorded = finisher(lost)
    assert recorded is not None and recorded.status == Status.SANDBOX_ERROR
    result = json.loads(aws.item("r-2")["result"]["S"])  # type: ignore[index]
    assert (result["attempts"], result["loss_mask"]) == (3, True)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"


def test_a_sample_not_run_whose_result_is_anothers_is_only_counted(
    aws: Aws, finisher: Finisher
) -> None:
    execution, token = started(aws, "b-c")
    finisher.ledger.open("b-c", 1, token)
    assert aws.admission.admit("r-cancelled")
    skipped = Finished(
        batch_id="b-c", request_id="r-cancelled", job_uri="s3://x/y", outcome="not_run"
    )
    assert finisher(skipped) is None
    assert aws.item("r-cancelled") is None  # the cancel writes its result, not the finisher
    assert aws.admission.in_flight() == 0  # its untaken slot went back
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"
