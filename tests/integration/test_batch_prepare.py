"""A batch's Run step under moto: a GRPO group of one task is prepared with one task-set read,
each sample gets its own work message, a rejected sample gets its result at once, and the
batch's ledger holds the token its execution waits on."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_batch_ledger import started
from tests.integration.test_worker import wait_for
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.keys import taskset_key
from trialbox.models import ExecutionRequest, Status
from trialbox.models.batches import BatchInput, BatchWork
from trialbox.models.jobs import JobSpec, RolloutInput
from trialbox.pipeline.batch_prepare import BatchPreparer
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import Recorder

GROUP = 12


@pytest.fixture
def run_step(aws: Aws, preparer: Preparer) -> BatchPreparer:
    return BatchPreparer(
        preparer,
        Recorder(aws.table, aws.traces, aws.admission),
        Ledger(aws.dynamodb, aws.sfn, aws.admission.table),
        aws.traces,
        aws.sqs,
        aws.work_queue,
    )


def batch(aws: Aws, batch_id: str, requests: list[ExecutionRequest]) -> BatchInput:
    rollouts = [
        RolloutInput(request_id=r.request_id, request=r).model_dump(mode="json") for r in requests
    ]
    uri = aws.traces.put_bytes(
        f"batches/{batch_id}.json", json.dumps(rollouts).encode(), "application/json"
    )
    return BatchInput(
        batch_id=batch_id, requests_uri=uri, request_ids=[r.request_id for r in requests]
    )


def test_a_group_is_prepared_with_one_task_set_read_and_a_message_per_sample(
    aws: Aws, run_step: BatchPreparer, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = json.dumps(ADD_TASK | {"task_id": "add"})
    aws.s3.put_object(Bucket="tasksets", Key=taskset_key("demo", "v1"), Body=line.encode())
    reads: list[str] = []
    original = aws.tasksets.get_bytes
    monkeypatch.setattr(aws.tasksets, "get_bytes", lambda uri: reads.append(uri) or original(uri))
    group = [
        ExecutionRequest.model_validate(
            {"request_id": f"g-{n}", "task_ref": "demo@v1/add", "files": {"solution.py": CORRECT}}
        )
        for n in range(GROUP)
    ]
    rejected = ExecutionRequest.model_validate({"request_id": "g-bad", "task_ref": "demo@v1/nope"})
    execution, token = started(aws, "b-group")
    run_step(batch(aws, "b-group", [*group, rejected]), token)

    assert reads == ["s3://tasksets/tasksets/demo@v1.jsonl"]
    works: list[BatchWork] = []
    while len(works) < GROUP:
        found = aws.messages(aws.work_queue)
        assert found, f"{len(works)} work messages of {GROUP}"
        works += [BatchWork.model_validate_json(m["Body"]) for m in found]
    assert sorted(w.request_id for w in works) == sorted(r.request_id for r in group)
    for work in works:
        job = JobSpec.model_validate_json(aws.traces.get_bytes(work.job_uri))
        assert (work.batch_id, job.request_id, job.task.task_id) == (
            "b-group",
            work.request_id,
            "add",
        )
        assert 0 < work.budget_s < 3600
    item = aws.item("g-bad")
    assert item is not None and item["status"] == {"S": Status.REJECTED.value}
    assert aws.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
    for work in works:  # the last sample's result ends the batch
        run_step.ledger.finish("b-group", work.request_id)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"


def test_a_batch_of_rejected_samples_alone_ends_at_once(aws: Aws, run_step: BatchPreparer) -> None:
    bad = ExecutionRequest.model_validate({"request_id": "only-bad", "task_ref": "x@1/y"})
    execution, token = started(aws, "b-bad")
    run_step(batch(aws, "b-bad", [bad]), token)
    assert wait_for(aws, execution)["status"] == "SUCCEEDED"
    assert aws.item("only-bad") is not None
