"""Admission: the stack starts an execution only when a pool slot is there to take its job.

Step Functions starts an Execute step's heartbeat clock (and its TimeoutSeconds) when the work
message is sent, not when a worker takes it, so a job that waits in the work queue longer than
the heartbeat looks like a lost sandbox. Here the backlog waits in the requests queue instead:
the dispatcher admits a request (and only then calls StartExecution) while the requests in
flight are fewer than the pool's live slots, whatever the number of clients sending.

One DynamoDB table (partition key `part`, sort key `id`) holds three kinds of item, each small:
- the count: (`pool`, `in_flight`), the requests admitted and not yet released;
- a marker per admitted request: (`admitted#<shard>`, request id). Admission and release each
  change the count and the marker in one transaction, conditionally, so a redelivered message
  is admitted once and a second release changes nothing;
- a lease per live worker: (`workers`, name) with its free `slots` and `expires_at`. The pool's
  capacity is the sum over unexpired leases: a worker that scales in removes its own, a killed
  one's lapses within a lease term.

An execution that ends without Record (stopped by a cancel, Record's own fallback) keeps its
marker; `reconcile` (the reaper, each minute) releases every marker whose request has its
terminal result.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from trialbox.constants import TABLE_KEY

PART = "part"
ID = "id"
POOL = "pool"
COUNT = "in_flight"
WORKERS = "workers"
SHARDS = 8  # marker partitions: admissions spread their writes over these
CAPACITY_CACHE_S = 2.0  # the leases are read at most this often by one dispatcher
BATCH_GET = 100  # BatchGetItem's most keys


def shard(request_id: str) -> str:
    digest = hashlib.sha256(request_id.encode()).digest()
    return f"admitted#{digest[0] % SHARDS}"


@dataclass
class Admission:
    dynamodb: Any
    table: str
    _capacity: tuple[float, int] = field(default=(0.0, 0), repr=False)

    def _key(self, part: str, id_: str) -> dict[str, Any]:
        return {PART: {"S": part}, ID: {"S": id_}}

    # The pool's side --------------------------------------------------------------------
    def lease(self, worker: str, slots: int, term_s: float) -> None:
        """A worker's free slots, good for `term_s` unless renewed."""
        self.dynamodb.put_item(
            TableName=self.table,
            Item=self._key(WORKERS, worker)
            | {
                "slots": {"N": str(slots)},
                "expires_at": {"N": repr(time.time() + term_s)},
            },
        )

    def leave(self, worker: str) -> None:
        self.dynamodb.delete_item(TableName=self.table, Key=self._key(WORKERS, worker))

    def _leases(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="#p = :w",
            ExpressionAttributeNames={"#p": PART},
            ExpressionAttributeValues={":w": {"S": WORKERS}},
            ConsistentRead=True,
        )
        for page in pages:
            items.extend(page.get("Items", []))
        return items

    def capacity(self, now: float | None = None) -> int:
        """The slots of every worker whose lease is live (read at most every CAPACITY_CACHE_S)."""
        now = time.time() if now is None else now
        read_at, slots = self._capacity
        if now - read_at < CAPACITY_CACHE_S:
            return slots
        slots = sum(
            int(item["slots"]["N"])
            for item in self._leases()
            if float(item["expires_at"]["N"]) > now
        )
        self._capacity = (now, slots)
        return slots

    def in_flight(self) -> int:
        answer = self.dynamodb.get_item(
            TableName=self.table, Key=self._key(POOL, COUNT), ConsistentRead=True
        )
        return int(answer.get("Item", {}).get(COUNT, {}).get("N", 0))

    # The dispatcher's side --------------------------------------------------------------
    def admit(self, request_id: str) -> bool:
        """Admit the request if a slot is free; True as well when it was admitted before (a
        redelivered message: its execution may already run)."""
        capacity = self.capacity()
        update = {
            "TableName": self.table,
            "Key": self._key(POOL, COUNT),
            "UpdateExpression": "SET #n = if_not_exists(#n, :zero) + :one",
            # The count's first write too: a pool of no slot admits nothing.
            "ConditionExpression": (
                "(attribute_not_exists(#n) AND :zero < :capacity) OR #n < :capacity"
            ),
            "ExpressionAttributeNames": {"#n": COUNT},
            "ExpressionAttributeValues": {
                ":zero": {"N": "0"},
                ":one": {"N": "1"},
                ":capacity": {"N": str(capacity)},
            },
        }
        marker = {
            "TableName": self.table,
            "Item": self._key(shard(request_id), request_id) | {"at": {"N": repr(time.time())}},
            "ConditionExpression": "attribute_not_exists(#i)",
            "ExpressionAttributeNames": {"#i": ID},
        }
        try:
            self.dynamodb.transact_write_items(TransactItems=[{"Update": update}, {"Put": marker}])
        except ClientError as exc:
            reasons = _reasons(exc)
            if reasons is None:
                raise
            return reasons[1] == "ConditionalCheckFailed"  # admitted already; else: full
        return True

    def release(self, request_id: str) -> bool:
        """Give the request's slot back; False when it held none (released already)."""
        delete = {
            "TableName": self.table,
            "Key": self._key(shard(request_id), request_id),
            "ConditionExpression": "attribute_exists(#i)",
            "ExpressionAttributeNames": {"#i": ID},
        }
        update = {
            "TableName": self.table,
            "Key": self._key(POOL, COUNT),
            "UpdateExpression": "SET #n = #n - :one",
            "ConditionExpression": "#n > :zero",
            "ExpressionAttributeNames": {"#n": COUNT},
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":zero": {"N": "0"}},
        }
        try:
            self.dynamodb.transact_write_items(
                TransactItems=[{"Delete": delete}, {"Update": update}]
            )
        except ClientError as exc:
            reasons = _reasons(exc)
            if reasons is None:
                raise
            if reasons[0] == "ConditionalCheckFailed":
                return False
            # A marker with a count of 0 (a count reset by hand): the marker alone goes.
            self.dynamodb.delete_item(TableName=self.table, Key=delete["Key"])
        return True

    # The reaper's side ------------------------------------------------------------------
    def admitted(self) -> list[str]:
        ids: list[str] = []
        for number in range(SHARDS):
            pages = self.dynamodb.get_paginator("query").paginate(
                TableName=self.table,
                KeyConditionExpression="#p = :s",
                ExpressionAttributeNames={"#p": PART, "#i": ID},
                ExpressionAttributeValues={":s": {"S": f"admitted#{number}"}},
                ProjectionExpression="#i",
            )
            for page in pages:
                ids.extend(item[ID]["S"] for item in page.get("Items", []))
        return ids

    def reconcile(self, results_table: str) -> list[str]:
        """Release every admitted request that already has its terminal result (its execution
        ended without Record's release), and drop lapsed leases. The released ids."""
        admitted = self.admitted()
        released = []
        for start in range(0, len(admitted), BATCH_GET):
            for request_id in _recorded(
                self.dynamodb, results_table, admitted[start : start + BATCH_GET]
            ):
                if self.release(request_id):
                    released.append(request_id)
        now = time.time()
        for item in self._leases():
            if float(item["expires_at"]["N"]) <= now:
                _delete_lapsed(self.dynamodb, self.table, item, now)
        return released


def _delete_lapsed(dynamodb: Any, table: str, item: dict[str, Any], now: float) -> None:
    """A lease that lapsed, unless its worker renewed it meanwhile."""
    try:
        dynamodb.delete_item(
            TableName=table,
            Key={PART: item[PART], ID: item[ID]},
            ConditionExpression="expires_at <= :now",
            ExpressionAttributeValues={":now": {"N": repr(now)}},
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise


def _recorded(dynamodb: Any, table: str, request_ids: list[str]) -> list[str]:
    """The ids among `request_ids` (at most 100) that have a terminal result."""
    keys: list[dict[str, Any]] = [{TABLE_KEY: {"S": rid}} for rid in request_ids]
    found: list[str] = []
    request: dict[str, Any] = {
        table: {
            "Keys": keys,
            "ConsistentRead": True,
            "ProjectionExpression": "#k",
            "ExpressionAttributeNames": {"#k": TABLE_KEY},
        }
    }
    while request:
        answer = dynamodb.batch_get_item(RequestItems=request)
        found.extend(item[TABLE_KEY]["S"] for item in answer["Responses"].get(table, []))
        request = answer.get("UnprocessedKeys") or {}
    return found


def _reasons(exc: ClientError) -> list[str] | None:
    """A cancelled transaction's reason per item ('None' where that item's check held), or
    None when the error is not a cancelled transaction."""
    if exc.response["Error"]["Code"] != "TransactionCanceledException":
        return None
    reasons = exc.response.get("CancellationReasons") or []
    codes = [str(reason.get("Code", "None")) for reason in reasons]
    if "TransactionConflict" in codes or "ThrottlingError" in codes or len(codes) < 2:
        return None  # a conflict or a throttle: the caller's retry (raise)
    return codes
