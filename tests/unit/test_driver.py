"""Admission control: at most `concurrency` requests in flight, recorded results taken as they
are, nothing submitted after a stop."""

from __future__ import annotations

from typing import Any

import pytest

from trialbox.driver import Driver
from trialbox.models import ExecutionRequest, ExecutionResult, Status

RESULT = ExecutionResult(request_id="x", status=Status.SUCCEEDED, reward=1.0, loss_mask=False)


class FakePipeline:
    """A client whose pipeline finishes each request one poll after it was submitted."""

    def __init__(self, recorded: set[str] | None = None) -> None:
        self.submitted: list[list[str]] = []
        self.pending: set[str] = set()
        self.recorded = recorded or set()
        self.max_in_flight = 0

    def submit(self, requests: list[ExecutionRequest]) -> list[str]:
        self.submitted.append([r.request_id for r in requests])
        self.pending.update(r.request_id for r in requests)
        self.max_in_flight = max(self.max_in_flight, len(self.pending))
        return [r.request_id for r in requests]

    def poll(self, ids: list[str]) -> dict[str, ExecutionResult]:
        done = [rid for rid in ids if rid in self.recorded]
        self.recorded.update(rid for rid in ids if rid in self.pending)
        self.pending.difference_update(ids)
        return {rid: RESULT.model_copy(update={"request_id": rid}) for rid in done}


def requests(n: int) -> list[ExecutionRequest]:
    body: dict[str, Any] = {"task_ref": "t@1/x", "files": {"a.py": ""}}
    return [ExecutionRequest.model_validate(body | {"request_id": f"r{i}"}) for i in range(n)]


def test_the_driver_keeps_at_most_concurrency_in_flight() -> None:
    pipeline = FakePipeline()
    got: list[str] = []
    driver = Driver(
        pipeline,  # type: ignore[arg-type]
        requests(25),
        concurrency=4,
        on_result=lambda rid, result, elapsed: got.append(rid),
        poll_s=0,
    )
    driver.run(timeout_s=30)
    assert sorted(got) == sorted(f"r{i}" for i in range(25)) and len(got) == 25
    assert pipeline.max_in_flight == 4
    assert all(len(batch) <= 4 for batch in pipeline.submitted)


def test_the_driver_takes_recorded_results_without_resubmitting() -> None:
    pipeline = FakePipeline(recorded={"r0", "r2"})
    got: dict[str, float | None] = {}
    driver = Driver(
        pipeline,  # type: ignore[arg-type]
        requests(3),
        concurrency=10,
        on_result=lambda rid, result, elapsed: got.update({rid: elapsed}),
        poll_s=0,
    )
    driver.collect_recorded()
    driver.run(timeout_s=30)
    assert pipeline.submitted == [["r1"]]
    assert got["r0"] is None and got["r2"] is None and got["r1"] is not None


def test_a_stopped_driver_submits_nothing_more_and_drains() -> None:
    pipeline = FakePipeline()
    got: list[str] = []

    def stop_at_first(rid: str, result: ExecutionResult, elapsed: float | None) -> None:
        got.append(rid)
        driver.stopping = True  # what the CLI's SIGINT handler does

    driver = Driver(
        pipeline,  # type: ignore[arg-type]
        requests(30),
        concurrency=5,
        on_result=stop_at_first,
        poll_s=0,
    )
    driver.run(timeout_s=30)
    driver.drain(grace_s=5)
    assert sum(len(b) for b in pipeline.submitted) == 5 and len(got) == 5
    assert not driver.in_flight and len(driver.waiting) == 25


class FakeTwinClient(FakePipeline):
    """What Client.run needs of a client: a pool of known size, submit and poll."""

    capacity = 2


def test_client_run_keeps_four_per_worker_in_flight_and_returns_in_order() -> None:
    from trialbox.client import Client

    pipeline = FakeTwinClient()
    results = Client.run(pipeline, requests(30), timeout=30)  # type: ignore[arg-type]
    assert [r.request_id for r in results] == [f"r{i}" for i in range(30)]
    assert pipeline.max_in_flight == 8


def test_client_run_names_what_had_no_result_when_time_runs_out() -> None:
    from trialbox.client import Client, WaitTimeout

    class Stuck(FakeTwinClient):
        def poll(self, ids: list[str]) -> dict[str, ExecutionResult]:
            return {}

    with pytest.raises(
        WaitTimeout, match=r"3 request\(s\) had no terminal result after 0.2 s"
    ) as exc:
        Client.run(Stuck(), requests(3), timeout=0.2)  # type: ignore[arg-type]
    assert exc.value.missing == ["r0", "r1", "r2"]
