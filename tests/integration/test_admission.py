"""Admission under moto: the dispatcher starts an execution only for a free pool slot; a full
pool sends the request back to the requests queue (never a failed receive); a slot is
released once, whatever retries; and what dead-letters still gets its one result."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_dispatch import PASS_MACHINE, request
from tests.integration.test_worker import wait_for
from tests.support.moto import Aws, admission_table
from trialbox.keys import execution_arn
from trialbox.models import Status
from trialbox.models.jobs import StepError
from trialbox.pipeline import admission as admission_module
from trialbox.pipeline.admission import Admission, shard
from trialbox.pipeline.dead_letters import DeadLetter, DeadLetters, EndedWithoutResult
from trialbox.pipeline.dispatch import Dispatched, Dispatcher
from trialbox.pipeline.recorder import Recorder, RecordInput
from trialbox.pipeline.stores import ResultTable
from trialbox.worker.lease import hold_lease


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


def never_ended(request_id: str, execution: str) -> bool:
    return False


def test_the_reaper_releases_what_ended_without_record_and_nobody_holds(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """A cancel before any worker took the job (StopExecution: Record never runs) keeps the
    marker; the reaper sees the request's terminal result and gives the slot back. Still-
    running requests keep theirs."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 2, term_s=60)
    assert [dispatch(request(f"r-{n}")) for n in (1, 2)] == [Dispatched.STARTED] * 2
    aws.table.put_terminal("r-1", {"status": "cancelled"})
    assert pool.reconcile(aws.table.table, never_ended) == ["r-1"]
    assert pool.in_flight() == 1 and list(pool.admitted()) == ["r-2"]
    assert pool.reconcile(aws.table.table, never_ended) == []


def test_a_slot_whose_sandbox_still_runs_is_the_workers_to_give_back(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Was a break (red team): a cancelled request's slot was freed by its result while its
    sandbox ran on, and two jobs admitted for it waited past their heartbeat (masked). A slot
    a worker took is given back by that worker when its run ends, or, if the worker died (its
    lease lapsed), by the reaper; never by the result."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)
    pool.lease("w-dead", 1, term_s=60)
    assert [dispatch(request(f"r-{n}")) for n in (1, 2)] == [Dispatched.STARTED] * 2
    assert pool.take("r-1", "w-1") and pool.take("r-2", "w-dead")
    for rid in ("r-1", "r-2"):
        aws.table.put_terminal(rid, {"status": "cancelled"})
    Recorder(aws.table, aws.traces, pool)(RecordInput(request_id="r-1", error=StepError(Error="x")))
    assert pool.reconcile(aws.table.table, never_ended) == [] and pool.in_flight() == 2
    pool.lease("w-dead", 1, term_s=-1)  # its lease lapses: it died with the job
    assert pool.reconcile(aws.table.table, never_ended) == ["r-2"]
    assert pool.release("r-1", worker="w-dead") is False  # not its slot
    assert pool.release("r-1", worker="w-1") and pool.in_flight() == 0


class Called:
    """DynamoDB whose calls are noted, by method."""

    def __init__(self, dynamodb: Any) -> None:
        self.dynamodb, self.calls = dynamodb, []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.dynamodb, name)
        if name.startswith("_") or not callable(method):
            return method

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return noted


def test_a_worker_gives_its_slot_back_in_one_call_and_record_after_it_in_none(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Were 3 of the 36 calls a sample made (benchmarks/orchestration_cpu.py --calls): the
    worker's release read the marker its take could have answered, and Record, after the
    worker's answer, read it again and tried a transaction bound to fail (a slot a worker
    took is that worker's to give back)."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)
    assert dispatch(request("r-1")) == Dispatched.STARTED
    called = Called(aws.dynamodb)
    admission = Admission(called, pool.table)
    held = admission.take("r-1", "w-1")
    assert held is not None
    assert admission.release("r-1", worker="w-1", held=held) and pool.in_flight() == 0
    assert called.calls == ["update_item", "transact_write_items"]
    answered = {"worker": "w-1", "report_uri": "s3://traces/r-1.json", "holds_slot": True}
    state = RecordInput(request_id="r-1", error=StepError(Error="x"), execution=answered)
    assert Recorder(aws.table, aws.traces, admission)(state).written
    assert called.calls == ["update_item", "transact_write_items"]  # Record: none
    assert admission.take("r-1", "w-1") is None  # no slot: nothing to take


def test_record_gives_back_the_slot_of_a_worker_whose_take_failed(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Red team: a worker that ran the job without taking its slot (the take failed: a
    throttled table) cannot give it back; its answer says so, and Record does, at once."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)
    assert dispatch(request("r-1")) == Dispatched.STARTED and pool.in_flight() == 1
    answered = {"worker": "w-1", "report_uri": "s3://traces/r-1.json", "holds_slot": False}
    state = RecordInput(request_id="r-1", execution=answered)
    assert Recorder(aws.table, aws.traces, pool)(state).written
    assert pool.in_flight() == 0


def test_a_dead_workers_job_keeps_its_slot_for_its_retry_and_names_no_taker(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Was a break (red team 25): the reaper gave a dead worker's slot back, so the job's
    retry held none, and each lapse of the retry's wait was counted as a lost sandbox. Now
    the marker says the job was lost and names no taker: the state machine counts that lost
    sandbox once (and clears the flag), and the retry keeps the slot it runs on."""
    dispatch, _ = dispatcher
    pool.lease("w-dead", 1, term_s=60)
    assert dispatch(request("r-lost")) == Dispatched.STARTED
    assert pool.take("r-lost", "w-dead")
    pool.lease("w-dead", 1, term_s=-1)  # its lease lapses: it died with the job
    assert pool.reconcile(aws.table.table, never_ended) == []
    assert pool.in_flight() == 1
    marker = aws.dynamodb.get_item(
        TableName=pool.table, Key={"part": {"S": shard("r-lost")}, "id": {"S": "r-lost"}}
    )["Item"]
    assert (marker.get("taken_by"), marker["lost"]) == (None, {"BOOL": True})
    assert pool.take("r-lost", "w-2")  # the retry's worker: the flag goes with its take
    marker = aws.dynamodb.get_item(
        TableName=pool.table, Key={"part": {"S": shard("r-lost")}, "id": {"S": "r-lost"}}
    )["Item"]
    assert (marker["taken_by"], marker.get("lost")) == ({"S": "w-2"}, None)


def test_an_execution_that_ended_without_a_result_gets_one_and_its_slot_back(
    aws: Aws,
    pool: Admission,
    dispatcher: tuple[Dispatcher, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (red team): an execution stopped by hand (or whose Record fallback failed)
    left its request without a result and its slot held forever."""
    dispatch, _ = dispatcher
    monkeypatch.setattr(admission_module, "STALE_S", 0.0)
    pool.lease("w-1", 2, term_s=60)
    assert [dispatch(request(f"r-{n}")) for n in (1, 2)] == [Dispatched.STARTED] * 2
    stopped = execution_arn(dispatch.rollout_arn, "r-1")
    aws.sfn.stop_execution(executionArn=stopped)
    wait_for(aws, stopped)  # moto's execution thread notes the stop a moment later
    ended = EndedWithoutResult(aws.sfn, dispatch.rollout_arn, aws.table)
    assert pool.reconcile(aws.table.table, ended) == ["r-1"]
    item = aws.item("r-1")
    assert item is not None and item["status"] == {"S": Status.SANDBOX_ERROR.value}
    assert "ABORTED" in item["result"]["S"] and aws.item("r-2") is None
    assert pool.in_flight() == 1


def test_a_start_that_fails_gives_its_slot_back_at_once(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Was a break (red team): a throttled StartExecution held its slot, with nothing running,
    until the message came back or dead-lettered (up to 9 minutes)."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)

    class Throttled:
        exceptions = aws.sfn.exceptions

        def start_execution(self, **kwargs: Any) -> Any:
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "StartExecution")

        def describe_execution(self, **kwargs: Any) -> Any:
            return aws.sfn.describe_execution(**kwargs)

    dispatch.sfn = Throttled()
    with pytest.raises(ClientError):
        dispatch(request("r-1"))
    assert pool.in_flight() == 0 and list(pool.admitted()) == []


def test_a_request_that_ended_while_it_waited_holds_no_slot(
    aws: Aws,
    pool: Admission,
    dispatcher: tuple[Dispatcher, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was a break (red team): a redelivered message of a request that ended meanwhile was
    admitted again, and its slot held until the reaper ran."""
    dispatch, _ = dispatcher
    pool.lease("w-1", 1, term_s=60)
    admit = pool.admit_new

    def admit_then_end(request_id: str) -> bool | None:
        admitted = admit(request_id)
        aws.table.put_terminal(request_id, {"status": "cancelled"})  # its client cancels
        return admitted

    monkeypatch.setattr(pool, "admit_new", admit_then_end)
    assert dispatch(request("r-1")) == Dispatched.ALREADY_ENDED
    assert pool.in_flight() == 0 and executions(aws, dispatch) == []


def test_the_reaper_drops_lapsed_leases_only(pool: Admission) -> None:
    pool.lease("alive", 1, term_s=60)
    pool.lease("dead", 1, term_s=-1)
    pool.reconcile("executions", never_ended)
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


class Conflicting:
    """DynamoDB whose first `times` transactions conflict with another one on the count (as two
    dispatchers admitting at once do on AWS)."""

    def __init__(self, dynamodb: Any, times: int) -> None:
        self.dynamodb, self.times = dynamodb, times

    def transact_write_items(self, **kwargs: Any) -> Any:
        if self.times > 0:
            self.times -= 1
            reasons = [{"Code": "TransactionConflict"}, {"Code": "None"}]
            raise ClientError(
                {"Error": {"Code": "TransactionCanceledException"}, "CancellationReasons": reasons},
                "TransactWriteItems",
            )
        return self.dynamodb.transact_write_items(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dynamodb, name)


def test_a_transaction_conflict_is_tried_again_never_taken_for_a_full_pool(
    aws: Aws, pool: Admission
) -> None:
    pool.lease("w-1", 2, term_s=60)
    assert Admission(Conflicting(aws.dynamodb, 2), pool.table).admit("r-1")
    assert pool.in_flight() == 1
    # Contended through every retry: not admitted now (the dispatcher asks again), nothing lost.
    busy = Admission(Conflicting(aws.dynamodb, 100), pool.table)
    assert busy.admit("r-2") is False and pool.in_flight() == 1
    with pytest.raises(admission_module.Contended):  # Record's own retry takes it from here
        busy.release("r-1")
    assert pool.release("r-1") and pool.in_flight() == 0


def test_a_lease_says_at_once_when_its_workers_free_slots_change(pool: Admission) -> None:
    """Was a break (red team): an rlimit worker taken by an exclusive session still leased a
    slot for up to 10 s (its renewal), and a job was admitted for it."""
    slots, stop, changed = [1], threading.Event(), threading.Event()
    thread = hold_lease(pool, "w-1", lambda: slots[0], stop, changed)
    deadline = time.monotonic() + 5
    while pool.capacity() != 1:  # (the fixture reads the leases afresh each time)
        assert time.monotonic() < deadline
    slots[0] = 0  # a session took it
    changed.set()
    deadline = time.monotonic() + 1  # well within the 10 s renewal
    while pool.capacity() != 0:
        assert time.monotonic() < deadline, "the lease still counts the worker's slot"
        time.sleep(0.05)
    stop.set()
    changed.set()
    thread.join(timeout=5)
    assert pool._leases() == []  # withdrawn when it stops


class Counted:
    """DynamoDB whose reads are noted: a GetItem's partition, a BatchGetItem's as `pool`
    when it reads the count's shards, and each marker's partition it reads with them."""

    def __init__(self, dynamodb: Any) -> None:
        self.dynamodb, self.parts = dynamodb, []

    def get_item(self, **kwargs: Any) -> Any:
        self.parts.append(kwargs["Key"]["part"]["S"])
        return self.dynamodb.get_item(**kwargs)

    def batch_get_item(self, **kwargs: Any) -> Any:
        (wanted,) = kwargs["RequestItems"].values()
        parts = [key["part"]["S"] for key in wanted["Keys"]]
        self.parts.extend(p for p in parts if p.startswith(admission_module.MARKERS))
        self.parts.extend({p.split("#")[0] for p in parts if p.startswith(admission_module.POOL)})
        return self.dynamodb.batch_get_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dynamodb, name)


def test_a_waiting_dispatcher_reads_the_count_alone_after_its_first_ask(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """Each poll of a full pool was two consistent reads (the count, and the request's marker,
    which only a redelivered message has, from its first ask on): 6 per sample on the twin
    under a burst, 1,240 of 5,600 calls. The marker is read once per wait."""
    dispatch, requeued = dispatcher
    pool.lease("w-1", 1, term_s=60)
    assert dispatch(request("r-1")) == Dispatched.STARTED
    counted = Counted(aws.dynamodb)
    dispatch.admission = Admission(counted, pool.table)
    assert dispatch(request("r-2"), wait_until=time.monotonic() + 0.5) == Dispatched.REQUEUED
    markers = [p for p in counted.parts if p.startswith(admission_module.MARKERS)]
    counts = [p for p in counted.parts if p == admission_module.POOL]
    assert len(markers) == 1 and len(counts) >= 4
    assert len(requeued) == 1  # back to the requests queue once its wait ran out


def test_a_request_that_waits_reads_the_count_and_its_marker_in_one_call(
    aws: Aws, pool: Admission, dispatcher: tuple[Dispatcher, list[str]]
) -> None:
    """A full pool's first ask read the count, then the request's marker (a redelivery's is
    there from the start) in a call of its own: one of 38 calls a HumanEval job made on the
    twin. Both are now one BatchGetItem; each poll after it reads the count alone. The
    request's result is read before its admission (a request that ended starts nothing) and
    after it (a cancel that found no marker relies on that read)."""
    dispatch, requeued = dispatcher
    pool.lease("w-1", 1, term_s=60)
    calls = Called(aws.dynamodb)
    dispatch.admission = Admission(calls, pool.table)
    dispatch.table = ResultTable(calls, aws.table.table, aws.table.ttl_days)

    def made() -> list[str]:  # but the leases' read, at most every CAPACITY_CACHE_S
        return [call for call in calls.calls if call != "get_paginator"]

    assert dispatch(request("r-1")) == Dispatched.STARTED
    assert made() == ["get_item", "batch_get_item", "transact_write_items", "get_item"]
    calls.calls.clear()
    assert dispatch(request("r-2"), wait_until=time.monotonic() + 0.25) == Dispatched.REQUEUED
    assert made()[:2] == ["get_item", "batch_get_item"]  # its result; the count and its marker
    assert set(made()[2:]) <= {"batch_get_item"} and requeued  # its polls read the count alone
    calls.calls.clear()
    aws.table.put_terminal("r-3", {"status": "cancelled"})  # cancelled before it was admitted
    assert dispatch(request("r-3"), wait_until=time.monotonic() + 30) == Dispatched.ALREADY_ENDED
    assert made() == ["get_item"]  # it waited for no slot


def test_admissions_spread_over_the_count_s_shards_within_each_share(pool: Admission) -> None:
    """Was a ceiling (docs/scaling.md): one count item, a transaction on it at every admission
    and release, caps the stack at 250 samples/s (1,000 write units/s an item, 2 a
    transactional write). The count is sharded: a pool of 64 slots admits 64 over every
    shard, none past its share of the capacity, the 65th waits, and each release gives back
    its own shard's slot."""
    pool.lease("w-1", 64, term_s=60)
    assert all(pool.admit(f"r-{n}") for n in range(64))
    assert pool.admit("r-64") is False and pool.in_flight() == 64
    counts = pool._read_counts()[0]
    assert counts == admission_module.count_shares(64) == [8] * admission_module.COUNT_SHARDS
    for n in range(64):
        assert pool.release(f"r-{n}")
        assert not pool.release(f"r-{n}")  # once
    assert pool._read_counts()[0] == [0] * admission_module.COUNT_SHARDS
    assert pool.admit("r-64")


def _marker_shard(pool: Admission, request_id: str) -> int:
    item = pool._marker(request_id)
    assert item is not None
    return int(item[admission_module.SHARD_OF]["N"])


def test_requests_admitted_before_the_count_was_sharded_still_hold_their_slots(
    aws: Aws, pool: Admission
) -> None:
    """Was a break (red team): deployed over a busy pool, the old count item (pool, in_flight)
    was ignored, so 8 more were admitted on a full pool of 8, and each old release freed a
    new admission's slot. The old count is read with the shards and only drains."""
    pool.lease("w-1", 8, term_s=600)
    old = [f"old-{n}" for n in range(8)]
    for request_id in old:  # what the unsharded code wrote: no count_shard on the marker
        aws.dynamodb.put_item(TableName=pool.table, Item={
            "part": {"S": shard(request_id)}, "id": {"S": request_id},
            "at": {"N": repr(time.time())}, "taken_by": {"S": "w-1"}})  # fmt: skip
    aws.dynamodb.put_item(TableName=pool.table, Item={
        "part": {"S": "pool"}, "id": {"S": "in_flight"}, "in_flight": {"N": "8"}})  # fmt: skip
    assert pool.admit_new("new-0") is None and pool.in_flight() == 8
    for n, request_id in enumerate(old):
        assert pool.release(request_id, worker="w-1")
        assert pool.admit_new(f"new-{n}") is True
        assert pool.admit_new(f"more-{n}") is None  # one freed slot, one admission
    assert pool.in_flight() == 8 and len(pool.admitted()) == 8


def test_a_stale_release_of_a_readmitted_request_leaves_the_new_admission_alone(
    aws: Aws, pool: Admission
) -> None:
    """Was a break (red team): a release read the marker (shard a), the request was released
    and admitted again meanwhile (on shard b), and the stale release then deleted the new
    marker against shard a's count: a slot counted forever on b. The release's delete now
    requires the shard it read."""
    pool.lease("w-1", 64, term_s=600)
    assert pool.admit("r")
    first = _marker_shard(pool, "r")
    stalled = Admission(aws.dynamodb, pool.table)
    read = stalled._marker

    def late(request_id: str) -> Any:
        seen = read(request_id)
        assert pool.release("r")
        while True:  # its message came back: admitted again, on another shard
            assert pool.admit("r")
            if _marker_shard(pool, "r") != first:
                return seen
            assert pool.release("r")

    stalled._marker = late  # type: ignore[method-assign]
    assert not stalled.release("r")
    assert pool.in_flight() == 1 and list(pool.admitted()) == ["r"]
    assert pool.release("r") and pool.in_flight() == 0


def test_an_item_no_lease_or_admission_wrote_breaks_neither_admission_nor_the_reaper(
    aws: Aws, pool: Admission
) -> None:
    """Was a break (red team): an UpdateItem that creates an item of a key and a flag only (a
    client's cancel may write the flag; IAM keeps it to the markers' partitions) made admit
    and reconcile raise KeyError. Readers skip what is not theirs."""
    pool.lease("w-1", 8, term_s=600)
    for part in ("workers", shard("stray")):
        aws.dynamodb.update_item(
            TableName=pool.table,
            Key={"part": {"S": part}, "id": {"S": "stray"}},
            UpdateExpression="SET #c = :yes",
            ExpressionAttributeNames={"#c": "cancelled"},
            ExpressionAttributeValues={":yes": {"BOOL": True}},
        )
    assert pool.admit("r-1") and pool.capacity() == 8
    assert pool.reconcile(aws.table.table, lambda *_: False) == []
    assert list(pool.admitted()) == ["r-1"]


def test_dispatchers_admitting_at_once_after_the_pool_shrank_stay_within_it(
    aws: Aws, pool: Admission
) -> None:
    """Was a break (red team): 64 slots shrank to 8, shard 7 still held 3 (over its share of
    1); 7 dispatchers that read the counts at the same moment admitted 9 on 8. A shard's
    excess now comes off the others' shares."""
    pool.lease("w-1", 64, term_s=600)
    ids = [f"r-{n}" for n in range(64)]
    assert all(pool.admit(request_id) for request_id in ids)
    pool.leave("w-1")
    pool.lease("w-2", 8, term_s=600)
    on_seven = [rid for rid in ids if _marker_shard(pool, rid) == 7][:3]
    for request_id in ids:
        if request_id not in on_seven:
            assert pool.release(request_id)
    assert pool._read_counts()[0] == [0] * 7 + [3] and pool.capacity() == 8
    together = threading.Barrier(7)
    answers: list[bool | None] = []

    def dispatch(n: int) -> None:
        mine = Admission(aws.dynamodb, pool.table)
        read, first = mine._read_counts, [True]

        def at_once(marker_of: str | None = None) -> tuple[list[int], int, bool]:
            seen = read(marker_of)
            if first.pop() if first else False:  # the first read, at the same moment
                together.wait(timeout=10)
            return seen

        mine._read_counts = at_once  # type: ignore[method-assign]
        answers.append(mine.admit_new(f"new-{n}"))

    threads = [threading.Thread(target=dispatch, args=(n,)) for n in range(7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert pool.in_flight() <= pool.capacity() == 8, (pool._read_counts()[0], answers)
    assert answers.count(True) == 5  # every free slot, and no more


def test_the_room_a_dispatcher_sees_is_the_capacity_less_every_slot_held() -> None:
    room = admission_module.room_shares
    shards = admission_module.COUNT_SHARDS
    for counts, capacity, legacy in (
        ([0] * 7 + [3], 8, 0),  # a shard over its share after the pool shrank
        ([0] * shards, 8, 8),  # the unsharded count holds them all
        ([2, 0, 0, 0, 0, 0, 0, 0], 3, 0),
        ([1] * shards, 64, 5),
    ):
        shares = room(counts, capacity, legacy)
        free = sum(max(0, s - n) for s, n in zip(shares, counts, strict=True))
        assert free == max(0, capacity - sum(counts) - legacy), (counts, capacity, legacy)
