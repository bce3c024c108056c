"""The pool's scaler: reads the demand, and sets the ECS service's desired count to what the
rule (trialbox.pipeline.scaling.desired) says. Run by functions/scaler each minute, deciding
every `tick_s` for most of the minute (EventBridge runs nothing more often, and growth within
seconds is what puts 4,096 tasks up in minutes: docs/scaling.md), and by the twin's elastic
pool the same way (trialbox.local: the pool follows the service's desired count).

The demand, each part from where it already is:
- queued: requests not yet admitted, the requests queue's visible and in-flight messages
  (a dispatcher holds one while it waits for a slot);
- waiting: the work queue's visible messages (admitted jobs not yet taken) and the open
  queue's (sessions waiting for a host);
- running: the admission count, summed over its shards (admitted, not yet released);
- held: the sessions the pool's workers host, their HeldSessions metric (trialbox.worker.
  metrics, the one the step policies' scale-in alarm read), summed over the pool's workers.

How long the pool has been idle lives in one item of the admission table, so that a scaler
run that starts cold (a new invocation, a new Lambda instance) knows it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from trialbox import constants as c
from trialbox.errors import TrialboxError
from trialbox.pipeline.admission import ID, PART, Admission
from trialbox.pipeline.scaling import Demand, PoolBounds, desired

log = logging.getLogger("trialbox.scaler")

# The idle clock's item in the admission table (beside the count's `pool#<k>` items).
IDLE_PART = "scaler"
IDLE_ID = "idle_since"
SINCE = "since"  # epoch seconds the demand was first seen at 0
# HeldSessions: each worker writes its count once a minute, so a minute's Sum is the pool's.
# The largest of the last HELD_MINUTES minutes: the newest minute may not have every worker's
# line yet (CloudWatch extracts them from the logs a little late).
HELD_PERIOD_S = 60
HELD_MINUTES = 3


class ServiceNotFound(TrialboxError):
    """The pool's ECS service is not there: the scaler's cluster or service setting is wrong."""


@dataclass(frozen=True)
class Decision:
    demand: Demand
    current: int  # the service's desired count as read
    desired: int  # as set (the same as `current` when nothing changed)
    idle_for_s: float


class DemandReader:
    """The four parts of the demand, read with the clients given."""

    def __init__(
        self,
        *,
        sqs: Any,
        cloudwatch: Any,
        admission: Admission,
        requests_queue_url: str,
        work_queue_url: str,
        open_queue_url: str,
        pool_name: str | None,
    ) -> None:
        self.sqs = sqs
        self.cloudwatch = cloudwatch
        self.admission = admission
        self.requests_queue_url = requests_queue_url
        self.work_queue_url = work_queue_url
        self.open_queue_url = open_queue_url
        self.pool_name = pool_name

    def read(self, now: float) -> Demand:
        requests = self._messages(
            self.requests_queue_url,
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
        )
        work = self._messages(self.work_queue_url, "ApproximateNumberOfMessages")
        work += self._messages(self.open_queue_url, "ApproximateNumberOfMessages")
        return Demand(
            queued=requests,
            waiting=work,
            running=self.admission.in_flight(),
            held=self.held(now),
        )

    def _messages(self, url: str, *counts: str) -> int:
        answer = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(counts))
        attributes = answer.get("Attributes", {})
        return sum(int(attributes.get(name, 0)) for name in counts)

    def held(self, now: float) -> int:
        """The sessions the pool's workers hold; 0 where no worker writes the metric (the
        twin's workers do not: there, the pool stops only workers that hold none)."""
        if not self.pool_name:
            return 0
        answer = self.cloudwatch.get_metric_data(
            MetricDataQueries=[
                {
                    "Id": "held",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": c.METRICS_NAMESPACE,
                            "MetricName": c.METRIC_HELD_SESSIONS,
                            "Dimensions": [{"Name": c.DIMENSION_POOL, "Value": self.pool_name}],
                        },
                        "Period": HELD_PERIOD_S,
                        "Stat": "Sum",
                    },
                }
            ],
            StartTime=datetime.fromtimestamp(now - HELD_MINUTES * HELD_PERIOD_S, UTC),
            EndTime=datetime.fromtimestamp(now, UTC),
        )
        values = [v for result in answer["MetricDataResults"] for v in result["Values"]]
        return int(max(values, default=0))


class IdleClock:
    """Since when the demand has been 0, in one item of the admission table: written when the
    pool turns idle and deleted when work comes, so a quiet pool costs one read a tick."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        self.dynamodb = dynamodb
        self.table = table
        self.key = {PART: {"S": IDLE_PART}, ID: {"S": IDLE_ID}}

    def idle_for(self, busy: bool, now: float) -> float:
        item = self.dynamodb.get_item(TableName=self.table, Key=self.key, ConsistentRead=True)
        since = float(item["Item"][SINCE]["N"]) if "Item" in item else None
        if busy:
            if since is not None:
                self.dynamodb.delete_item(TableName=self.table, Key=self.key)
            return 0.0
        if since is None:
            self.dynamodb.put_item(TableName=self.table, Item=self.key | {SINCE: {"N": repr(now)}})
            return 0.0
        return max(0.0, now - since)


class PoolService:
    """The pool's ECS service: its desired count, read and set."""

    def __init__(self, ecs: Any, cluster: str, service: str) -> None:
        self.ecs = ecs
        self.cluster = cluster
        self.service = service

    def desired_count(self) -> int:
        answer = self.ecs.describe_services(cluster=self.cluster, services=[self.service])
        if not answer.get("services"):
            raise ServiceNotFound(
                f"the pool's service {self.service} is not in cluster {self.cluster} "
                f"({answer.get('failures')}): check {c.ENV_CLUSTER} and {c.ENV_POOL_SERVICE}"
            )
        return int(answer["services"][0]["desiredCount"])

    def set_desired_count(self, count: int) -> None:
        self.ecs.update_service(cluster=self.cluster, service=self.service, desiredCount=count)


@dataclass
class Scaler:
    demand: DemandReader
    service: PoolService
    idle: IdleClock
    bounds: PoolBounds

    def tick(self, now: float | None = None) -> Decision:
        now = time.time() if now is None else now
        demand = self.demand.read(now)
        idle_for = self.idle.idle_for(demand.total > 0, now)
        current = self.service.desired_count()
        target = desired(demand, current, idle_for, self.bounds)
        if target != current:
            self.service.set_desired_count(target)
            log.info("pool: %d -> %d tasks (%s)", current, target, demand)
        return Decision(demand, current, target, idle_for)

    def run(
        self,
        for_s: float,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> list[Decision]:
        """A tick at once, then one every `every_s` while the next starts within `for_s`. A
        tick that fails (a throttle, a 5xx past its retries) is logged and the next one
        decides afresh: every tick reads everything again."""
        decisions: list[Decision] = []
        start = clock()
        while True:
            began = clock()
            try:
                decisions.append(self.tick())
            except (BotoCoreError, ClientError):
                log.exception("the scaler's tick failed; the next one decides again")
            next_at = began + every_s
            if next_at - start > for_s:
                return decisions
            sleep(max(0.0, next_at - clock()))
