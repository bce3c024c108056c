"""The pool's scaler (trialbox.pipeline.scaler): what it reads for the demand, where it keeps
the idle clock, and the desired count it sets, with fakes of the calls it makes."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from trialbox import constants as c
from trialbox.pipeline.scaler import (
    IDLE_ID,
    IDLE_PART,
    DemandReader,
    IdleClock,
    PoolService,
    Scaler,
    ServiceNotFound,
)
from trialbox.pipeline.scaling import Demand, PoolBounds

REQUESTS, WORK, OPENS = "https://sqs/requests", "https://sqs/work", "https://sqs/opens"


class Sqs:
    def __init__(self) -> None:
        self.depth = {
            REQUESTS: {
                "ApproximateNumberOfMessages": 7,
                "ApproximateNumberOfMessagesNotVisible": 3,
            },
            WORK: {"ApproximateNumberOfMessages": 2, "ApproximateNumberOfMessagesNotVisible": 50},
            OPENS: {"ApproximateNumberOfMessages": 0, "ApproximateNumberOfMessagesNotVisible": 0},
        }
        self.asked: list[tuple[str, list[str]]] = []

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        self.asked.append((QueueUrl, AttributeNames))
        return {"Attributes": {k: str(self.depth[QueueUrl][k]) for k in AttributeNames}}


class CloudWatch:
    def __init__(self, values: list[float]) -> None:
        self.values = values

    def get_metric_data(self, **kwargs: Any) -> dict[str, Any]:
        return {"MetricDataResults": [{"Id": "held", "Values": self.values}]}


class Count:
    def __init__(self, n: int) -> None:
        self.n = n

    def in_flight(self) -> int:
        return self.n


class Table:
    """The admission table's items, by (part, id)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    @staticmethod
    def _k(key: dict[str, Any]) -> tuple[str, str]:
        return key["part"]["S"], key["id"]["S"]

    def get_item(self, TableName: str, Key: dict[str, Any], ConsistentRead: bool) -> dict[str, Any]:
        assert ConsistentRead
        item = self.items.get(self._k(Key))
        return {} if item is None else {"Item": item}

    def put_item(self, TableName: str, Item: dict[str, Any]) -> None:
        self.writes += 1
        self.items[self._k(Item)] = Item

    def delete_item(self, TableName: str, Key: dict[str, Any]) -> None:
        self.writes += 1
        self.items.pop(self._k(Key), None)


class Ecs:
    def __init__(self, desired: int) -> None:
        self.desired = desired
        self.updates: list[int] = []

    def describe_services(self, cluster: str, services: list[str]) -> dict[str, Any]:
        if services != ["svc"]:
            return {"services": [], "failures": [{"arn": services[0], "reason": "MISSING"}]}
        return {"services": [{"desiredCount": self.desired}]}

    def update_service(self, cluster: str, service: str, desiredCount: int) -> None:
        self.desired = desiredCount
        self.updates.append(desiredCount)


def reader(
    running: int = 0, held: list[float] | None = None, sqs: Sqs | None = None
) -> DemandReader:
    return DemandReader(
        sqs=sqs or Sqs(),
        cloudwatch=CloudWatch(held or []),
        admission=Count(running),  # type: ignore[arg-type]
        requests_queue_url=REQUESTS,
        work_queue_url=WORK,
        open_queue_url=OPENS,
        pool_name="Trialbox",
    )


def test_the_demand_is_the_requests_not_admitted_the_work_waiting_the_count_and_the_held() -> None:
    sqs = Sqs()
    sqs.depth[OPENS] = {
        "ApproximateNumberOfMessages": 6,
        "ApproximateNumberOfMessagesNotVisible": 9,
    }
    demand = reader(running=5, held=[1.0, 4.0, 2.0], sqs=sqs).read(1_700_000_000)
    # requests: visible 7 + in flight 3; work and opens: visible only (a taken job is in the
    # count, a taken open in the held sessions).
    assert demand == Demand(queued=10, waiting=2 + 6, running=5, held=4)
    assert sqs.asked == [
        (REQUESTS, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]),
        (WORK, ["ApproximateNumberOfMessages"]),
        (OPENS, ["ApproximateNumberOfMessages"]),
    ]


def test_no_pool_name_reads_no_held_sessions() -> None:
    quiet = reader(held=[9.0])
    quiet.pool_name = None
    assert quiet.read(0).held == 0


def scaler(ecs: Ecs, table: Table, demand: DemandReader, **bounds: Any) -> Scaler:
    return Scaler(
        demand=demand,
        service=PoolService(ecs, "cluster", "svc"),
        idle=IdleClock(table, "admission"),
        bounds=PoolBounds(**({"min_tasks": 1, "max_tasks": 20, "idle_s": 300} | bounds)),
    )


def test_a_burst_sets_the_count_at_once_within_the_maximum() -> None:
    ecs, table = Ecs(desired=1), Table()
    decision = scaler(ecs, table, reader(running=5, held=[1.0])).tick(now=1000)
    assert (decision.current, decision.desired) == (1, 18)  # 10 + 2 + 5 + 1
    assert ecs.updates == [18]
    big = Sqs()
    big.depth[REQUESTS]["ApproximateNumberOfMessages"] = 500
    assert scaler(ecs, table, reader(sqs=big)).tick(now=1001).desired == 20
    assert ecs.updates == [18, 20]
    assert table.items == {}  # busy: no idle clock


def test_idle_scales_in_to_the_minimum_only_after_idle_s_and_work_resets_the_clock() -> None:
    ecs, table = Ecs(desired=6), Table()
    idle = Sqs()
    idle.depth[REQUESTS] = {k: 0 for k in idle.depth[REQUESTS]}
    idle.depth[WORK]["ApproximateNumberOfMessages"] = 0
    quiet = scaler(ecs, table, reader(sqs=idle))
    assert quiet.tick(now=1000).desired == 6
    assert table.items[(IDLE_PART, IDLE_ID)]["since"] == {"N": "1000"}
    assert quiet.tick(now=1299).desired == 6
    assert ecs.updates == [] and table.writes == 1  # one write when it turned idle, no more
    work = scaler(ecs, table, reader(running=1, sqs=idle))
    assert work.tick(now=1300).idle_for_s == 0  # a job: the clock starts again
    assert (IDLE_PART, IDLE_ID) not in table.items
    assert quiet.tick(now=1400).desired == 6
    last = quiet.tick(now=1700)
    assert (last.idle_for_s, last.desired) == (300, 1)
    assert ecs.updates == [1]


def test_a_wrong_service_is_an_error_that_names_the_settings() -> None:
    service = PoolService(Ecs(1), "cluster", "other")
    with pytest.raises(ServiceNotFound) as missing:
        service.desired_count()
    assert str(missing.value) == (
        "the pool's service other is not in cluster cluster ([{'arn': 'other', 'reason': "
        f"'MISSING'}}]): check {c.ENV_CLUSTER} and {c.ENV_POOL_SERVICE}"
    )


def test_a_run_ticks_every_tick_s_and_a_failed_tick_does_not_end_it() -> None:
    ecs, table = Ecs(desired=1), Table()
    run = scaler(ecs, table, reader(running=3))
    now = [0.0]
    ticks: list[float] = []
    real_tick = run.tick

    def tick(now_: float | None = None) -> Any:
        ticks.append(now[0])
        if len(ticks) == 2:
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "DescribeServices")
        return real_tick(1000 + now[0])

    run.tick = tick  # type: ignore[method-assign]

    def sleep(s: float) -> None:
        now[0] += s

    decisions = run.run(50, 10, clock=lambda: now[0], sleep=sleep)
    assert ticks == [0, 10, 20, 30, 40, 50]
    assert len(decisions) == 5 and ecs.updates == [15]
