"""Admission under moto: the dispatcher starts an execution only for a free pool slot; a full
pool sends the request back to the requests queue (never a failed receive); a slot is
released once, whatever retries; and what dead-letters still gets its one result."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_dispatch import PASS_MACHINE, request
from tests.support.moto import Aws, admission_table
from trialbox.models import Status
from trialbox.pipeline import admission as admission_module
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.dead_letters import DeadLetter, DeadLetters
from trialbox.pipeline.dispatch import Dispatched, Dispatcher
from trialbox.pipeline.recorder import Recorder, RecordInput, StepError


@pytest.fixture
def pool(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Admission:
    """An empty pool (no lease) whose capacity is read afresh on every admission."""
    monkeypatch.setattr(admission_module, "CAPACITY_CACHE_S", 0.0)
    return admission_table(aws.dynamodb, "pool", slots=0)


@pytest.fixture
def dispatcher(aws: Aws, pool: Admission) -> tuple[Dispatcher, list[str]]:
    arn = aws.state_machine("rollout", PASS_MACHINE)
    requeued: list[str] = []
    dispatch = Dispatcher(
        aws.sfn, arn, aws.table, aws.traces, lambda b, r: None, pool, requeued.append
    )
    return dispatch, requeued


def executions(aws: Aws, dispatch: Dispatcher) -> list[str]:
    listed = aws.sfn.list_executions(stateMachineArn=dispatch.rollout_arn)["executions"]
    return sorted(e["name"] for e in listed)


def test_with_no_worker_nothing_starts_and_the_request_goes_back_to_the_queue(
    aws: Aws, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, requeued = dispatcher
    body = request("r-1")
    assert dispatch(body) == Dispatched.REQUEUED
    assert requeued == [body] and executions(aws, dispatch) == []


def test_the_pool_admits_as_many_as_its_live_slots(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, requeued = dispatcher
    pool.lease("w-1", 2, term_s=60)
    pool.lease("w-2", 1, term_s=60)
    pool.lease("w-dead", 5, term_s=-1)  # lapsed: a killed worker's
    outcomes = [dispatch(request(f"r-{n}")) for n in range(5)]
    assert outcomes == [Dispatched.STARTED] * 3 + [Dispatched.REQUEUED] * 2
    assert executions(aws, dispatch) == ["r-0", "r-1", "r-2"]
    assert pool.in_flight() == 3
    # A redelivered admitted request is admitted again (its execution runs once), full or not.
    assert dispatch(request("r-0")) in (Dispatched.STARTED, Dispatched.ALREADY_STARTED)
    assert pool.in_flight() == 3 and len(requeued) == 2


def test_a_release_frees_one_slot_once_and_a_waiting_request_takes_it(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)
    assert dispatch(request("r-1")) == Dispatched.STARTED
    recorder = Recorder(aws.table, aws.traces, pool)
    ended = RecordInput(request_id="r-1", error=StepError(Error="Sandbox.Error", Cause="x"))
    recorder(ended)
    recorder(ended)  # Record retried: releases nothing more
    assert pool.in_flight() == 0
    assert pool.release("r-1") is False
    # A request waiting in the dispatcher takes the slot as soon as it is free.
    assert dispatch(request("r-2"), wait_until=time.monotonic() + 5) == Dispatched.STARTED
    assert pool.in_flight() == 1


def test_a_waiting_request_goes_back_when_its_wait_runs_out(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, requeued = dispatcher
    started = time.monotonic()
    assert dispatch(request("r-1"), wait_until=started + 1.0) == Dispatched.REQUEUED
    assert 0.7 < time.monotonic() - started < 2.0 and len(requeued) == 1


def test_the_reaper_releases_what_ended_without_record(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """A cancel (StopExecution: Record never runs) keeps the marker; the reaper sees the
    request's terminal result and gives the slot back. Still-running requests keep theirs."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 2, term_s=60)
    assert [dispatch(request(f"r-{n}")) for n in (1, 2)] == [Dispatched.STARTED] * 2
    aws.table.put_terminal("r-1", {"status": "cancelled"})
    assert pool.reconcile(aws.table.table) == ["r-1"]
    assert pool.in_flight() == 1 and pool.admitted() == ["r-2"]
    assert pool.reconcile(aws.table.table) == []


def test_the_reaper_drops_lapsed_leases_only(pool: Admission) -> None:
    pool.lease("alive", 1, term_s=60)
    pool.lease("dead", 1, term_s=-1)
    pool.reconcile("executions")
    assert [item["id"]["S"] for item in pool._leases()] == ["alive"]


def test_a_request_that_dead_lettered_before_its_execution_started_gets_one_sandbox_error(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, _ = dispatcher
    answer = DeadLetters(aws.sfn, dispatch.rollout_arn, aws.table, pool)
    pool.lease("w-1", 1, term_s=60)
    assert pool.admit("r-lost")  # admitted, then StartExecution failed on every delivery
    assert answer(request("r-lost"), {}) == DeadLetter.RECORDED
    item = aws.item("r-lost")
    assert item is not None and item["status"] == {"S": Status.SANDBOX_ERROR.value}
    assert item["loss_mask"] == {"BOOL": True}
    assert "StartExecution failed" in item["result"]["S"]
    assert pool.in_flight() == 0  # its slot is back
    assert answer(request("r-lost"), {}) == DeadLetter.ALREADY_ENDED  # one result, ever


def test_dead_letters_whose_execution_started_or_that_the_dispatcher_chose_are_left(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    dispatch, _ = dispatcher
    answer = DeadLetters(aws.sfn, dispatch.rollout_arn, aws.table, pool)
    pool.lease("w-1", 1, term_s=60)
    assert dispatch(request("r-run")) == Dispatched.STARTED
    assert answer(request("r-run"), {}) == DeadLetter.ALREADY_ENDED  # it writes its own
    reason = {"reason": {"stringValue": "reused", "dataType": "String"}}
    assert answer(request("r-other"), reason) == DeadLetter.LEFT
    assert answer("not json", {}) == DeadLetter.LEFT
    assert aws.item("r-run") is None and aws.item("r-other") is None
