"""The dispatcher's batch under moto: the requests one invocation admitted start as one
execution named by their ids; each marker names it first; the same messages redelivered
together start nothing more; and a sample whose named batch never started is free again."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_dispatch import PASS_MACHINE
from tests.integration.test_worker import wait_for
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox.keys import execution_arn
from trialbox.models import ExecutionRequest, Status
from trialbox.models.batches import BatchInput
from trialbox.models.jobs import RolloutInput
from trialbox.pipeline import admission as admission_module
from trialbox.pipeline.batching import BatchStarter, batch_id
from trialbox.pipeline.dead_letters import EndedWithoutResult


@pytest.fixture
def starter(aws: Aws) -> BatchStarter:
    arn = aws.state_machine("rollout", PASS_MACHINE)
    return BatchStarter(aws.sfn, aws.dynamodb, aws.admission.table, arn, aws.traces)


def rollout(aws: Aws, request_id: str) -> RolloutInput:
    assert aws.admission.admit(request_id)
    body = {"request_id": request_id, "task": ADD_TASK, "files": {"solution.py": CORRECT}}
    return RolloutInput(request_id=request_id, request=ExecutionRequest.model_validate(body))


def executions(aws: Aws, starter: BatchStarter) -> list[dict[str, str]]:
    listed = aws.sfn.list_executions(stateMachineArn=starter.rollout_arn)["executions"]
    return [
        json.loads(aws.sfn.describe_execution(executionArn=e["executionArn"])["input"])
        for e in listed
    ]


def test_what_one_invocation_admitted_starts_as_one_execution(
    aws: Aws, starter: BatchStarter
) -> None:
    ids = ["r-1", "r-2", "r-3"]
    for rid in ids:
        starter.add(rollout(aws, rid))
    name = starter.start()
    assert name == batch_id(ids) and starter.start() is None  # nothing left to start
    (started,) = executions(aws, starter)
    batch = BatchInput.model_validate(started)
    assert (batch.batch_id, batch.request_ids) == (name, ids)
    stored = json.loads(aws.traces.get_bytes(batch.requests_uri))
    assert [RolloutInput.model_validate(r).request_id for r in stored] == ids
    assert all(starter.carried_by(rid) == name for rid in ids)


def test_the_same_messages_redelivered_together_start_nothing_more(
    aws: Aws, starter: BatchStarter
) -> None:
    for _ in range(2):
        for rid in ("r-a", "r-b"):
            starter.add(rollout(aws, rid))
        starter.start()
    assert len(executions(aws, starter)) == 1


def test_a_sample_named_by_a_batch_that_never_started_is_free(
    aws: Aws, starter: BatchStarter
) -> None:
    starter.add(rollout(aws, "r-orphan"))
    starter._name("r-orphan", "b-never-started")  # the dispatcher died before StartExecution
    assert starter.carried_by("r-orphan") is None
    assert starter.carried_by("r-unnamed") is None
    name = starter.start()
    assert starter.carried_by("r-orphan") == name


def test_a_sample_of_a_batch_stopped_by_hand_gets_its_result_from_the_reaper(
    aws: Aws, starter: BatchStarter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a hole (review H6): StopExecution skips a batch's Catch, so Settle never ran, and
    the reaper looked for an execution named by the request id: the sample had no result,
    and its slot stayed, forever. The reaper now looks at the batch its marker names."""
    monkeypatch.setattr(admission_module, "STALE_S", 0.0)
    starter.add(rollout(aws, "r-stopped"))
    name = starter.start()
    assert name is not None
    stopped = execution_arn(starter.rollout_arn, name)
    aws.sfn.stop_execution(executionArn=stopped)
    wait_for(aws, stopped)
    ended = EndedWithoutResult(aws.sfn, starter.rollout_arn, aws.table)
    assert aws.admission.reconcile(aws.table.table, ended) == ["r-stopped"]
    item = aws.item("r-stopped")
    assert item is not None and item["status"] == {"S": Status.SANDBOX_ERROR.value}
    assert aws.admission.in_flight() == 0
