"""A sample's claim under moto: one holder at a time, a lapsed holder taken over as a lost
sandbox (attempt + 1, at most LOST_SANDBOX_RETRIES times), and a holder that was taken over,
cancelled or ran past its deadline cannot renew (it drops its run)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.moto import Aws
from trialbox.constants import LOST_SANDBOX_RETRIES
from trialbox.pipeline.claims import Claim, Claims, Refused

LEASE_S = 30.0
BUDGET_S = 600.0


@pytest.fixture
def claims(aws: Aws) -> Claims:
    return Claims(aws.dynamodb, aws.admission.table, LEASE_S)


def admitted(aws: Aws, request_id: str) -> str:
    assert aws.admission.admit(request_id)
    return request_id


def test_one_worker_holds_a_sample_and_another_is_refused(aws: Aws, claims: Claims) -> None:
    rid = admitted(aws, "s-1")
    assert claims.claim(rid, "w-1", BUDGET_S) == Claim(rid, "w-1", 0)
    assert claims.claim(rid, "w-2", BUDGET_S) == Refused.HELD
    assert claims.renew(Claim(rid, "w-1", 0))
    assert not claims.renew(Claim(rid, "w-2", 0))


def test_a_sample_without_a_marker_is_never_run(claims: Claims) -> None:
    assert claims.claim("never-admitted", "w-1", BUDGET_S) == Refused.GONE


def test_a_lapsed_holder_is_taken_over_as_a_lost_sandbox(aws: Aws, claims: Claims) -> None:
    rid = admitted(aws, "s-lapsed")
    start = time.time()
    first = claims.claim(rid, "w-1", BUDGET_S, now=start)
    assert first == Claim(rid, "w-1", 0)
    assert claims.claim(rid, "w-2", BUDGET_S, now=start + LEASE_S - 1) == Refused.HELD
    later = start + LEASE_S + 1
    assert claims.claim(rid, "w-2", BUDGET_S, now=later) == Claim(rid, "w-2", 1)
    assert not claims.renew(first, now=later)  # the first holder drops its run


def test_a_sample_lost_past_its_retries_is_not_run_again(aws: Aws, claims: Claims) -> None:
    rid = admitted(aws, "s-exhausted")
    now = time.time()
    for attempt in range(LOST_SANDBOX_RETRIES + 1):
        assert claims.claim(rid, f"w-{attempt}", BUDGET_S, now=now) == Claim(
            rid, f"w-{attempt}", attempt
        )
        now += LEASE_S + 1
    assert claims.claim(rid, "w-last", BUDGET_S, now=now) == Refused.EXHAUSTED


def test_a_cancelled_sample_is_not_claimed_and_its_holder_cannot_renew(
    aws: Aws, claims: Claims
) -> None:
    held, waiting = admitted(aws, "s-held"), admitted(aws, "s-waiting")
    holder = claims.claim(held, "w-1", BUDGET_S)
    assert isinstance(holder, Claim)
    assert claims.cancel(held) and claims.cancel(waiting)
    assert not claims.renew(holder)
    assert claims.claim(waiting, "w-2", BUDGET_S) == Refused.CANCELLED
    assert not claims.cancel("never-admitted")


def test_a_run_past_its_deadline_cannot_renew(aws: Aws, claims: Claims) -> None:
    rid = admitted(aws, "s-deadline")
    now = time.time()
    holder = claims.claim(rid, "w-1", budget_s=10, now=now)
    assert isinstance(holder, Claim)
    assert claims.renew(holder, now=now + 9)
    assert not claims.renew(holder, now=now + 11)


def test_of_two_workers_claiming_at_once_one_wins(aws: Aws, claims: Claims) -> None:
    rid = admitted(aws, "s-race")
    results: list[Claim | Refused] = []
    go = threading.Barrier(2)

    def take(worker: str) -> None:
        go.wait()
        results.append(claims.claim(rid, worker, BUDGET_S))

    threads = [threading.Thread(target=take, args=(w,)) for w in ("w-1", "w-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(isinstance(r, Claim) for r in results) == [False, True]
    assert Refused.HELD in results


def test_a_sample_the_reaper_found_lost_is_taken_over_as_a_lost_sandbox(
    aws: Aws, claims: Claims
) -> None:
    """The reaper marks the job of a worker whose lease lapsed `lost` and removes its name
    (trialbox.pipeline.admission): the next claim counts that lost sandbox, once."""
    rid = admitted(aws, "s-reaped")
    lapsed = time.time() - LEASE_S - 1  # its claim's lease lapsed with its worker's
    assert claims.claim(rid, "w-dead", BUDGET_S, now=lapsed) == Claim(rid, "w-dead", 0)
    aws.admission.lease("w-dead", 1, term_s=-1)
    aws.admission.reconcile(aws.table.table, lambda *_: False)
    assert claims.claim(rid, "w-2", BUDGET_S) == Claim(rid, "w-2", 1)
    assert claims.claim(rid, "w-3", BUDGET_S) == Refused.HELD  # counted once, held alive


def test_a_takeover_loses_to_a_holder_that_renewed_after_it_read(aws: Aws, claims: Claims) -> None:
    """Was a hole (review of this branch, H3): a takeover checked the holder and the attempt,
    not the lease it saw lapse, so a renewal between its read and its write was overwritten
    and two sandboxes ran the sample."""
    rid = admitted(aws, "s-renewed")
    first = claims.claim(rid, "w-1", BUDGET_S, now=time.time() - LEASE_S - 1)  # lapsed
    assert isinstance(first, Claim)
    other = Claims(aws.dynamodb, aws.admission.table, LEASE_S)
    read = other._read

    def read_then_the_holder_renews(request_id: str) -> dict[str, object] | None:
        item = read(request_id)
        assert claims.renew(first)
        return item

    other._read = read_then_the_holder_renews  # type: ignore[method-assign]
    assert other.claim(rid, "w-2", BUDGET_S) == Refused.HELD
    assert claims.renew(first)


def test_the_reaper_leaves_a_sample_whose_claim_is_alive(aws: Aws, claims: Claims) -> None:
    """Was a hole (H5): the reaper judged a batched sample's holder by its worker lease
    alone (throttled past its term, say) and marked a live claim lost."""
    rid = admitted(aws, "s-alive")
    holder = claims.claim(rid, "w-no-worker-lease", BUDGET_S)
    assert isinstance(holder, Claim)
    aws.admission.reconcile(aws.table.table, lambda *_: False)
    assert claims.renew(holder)


def test_a_finished_sample_is_never_taken_over(aws: Aws, claims: Claims) -> None:
    """Was a hole (H2): between the holder's report and the finisher's record, a copy of the
    work message (a retried Run, two batches) found the holder's lease lapsed, took it over
    and ran it again, counting a lost sandbox that never happened."""
    rid = admitted(aws, "s-finished")
    now = time.time()
    holder = claims.claim(rid, "w-1", BUDGET_S, now=now)
    assert isinstance(holder, Claim) and claims.finish(holder, now=now + 1)
    assert claims.claim(rid, "w-2", BUDGET_S, now=now + 10 * LEASE_S) == Refused.FINISHED
    taken_over = claims.claim(admitted(aws, "s-late"), "w-1", BUDGET_S, now=now - LEASE_S - 1)
    assert isinstance(taken_over, Claim)
    assert isinstance(claims.claim("s-late", "w-2", BUDGET_S), Claim)
    assert not claims.finish(taken_over)  # its claim moved on: no report from it
