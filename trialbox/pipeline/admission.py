"""Admission: the stack starts an execution only when a pool slot is there to take its job.

Step Functions starts an Execute step's heartbeat clock (and its TimeoutSeconds) when the work
message is sent, not when a worker takes it, so a job that waits in the work queue longer than
the heartbeat looks like a lost sandbox. Here the backlog waits in the requests queue instead:
the dispatcher admits a request (and only then calls StartExecution) while the requests in
flight are fewer than the pool's live slots, whatever the number of clients sending.

One DynamoDB table (partition key `part`, sort key `id`) holds three kinds of item, each small:
- the count, in COUNT_SHARDS items (`pool#<k>`, `in_flight`): the requests admitted on shard k
  and not yet released. One item takes 1,000 write units a second (its partition's), and every
  admission and release is a transaction on it (2 units): one item would cap the stack at 250
  samples a second whatever else it does (docs/scaling.md). Shard k admits up to its share of
  the pool's capacity; the dispatcher reads them all (one BatchGetItem) and admits on one with
  room, chosen at random, which also spreads concurrent dispatchers' transactions;
- a marker per admitted request: (`admitted#<shard>`, request id), with `taken_by` once a
  worker took its job. Admission and release each change the count and the marker in one
  transaction, conditionally, so a redelivered message is admitted once and a second release
  changes nothing. The marker names its count shard;
- a lease per live worker: (`workers`, name) with its free `slots` and `expires_at`. The pool's
  capacity is the sum over unexpired leases: a worker that scales in removes its own, a killed
  one's lapses within a lease term.

A slot is the sandbox's that uses it: the worker that took the job gives it back when its run
ends (a cancelled request's sandbox runs on); Record, only one no worker took. `reconcile`
(the reaper, each minute) gives back what nobody else will (docs/pipeline.md, "Admission").
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from trialbox.constants import TABLE_KEY

PART = "part"
ID = "id"
POOL = "pool"  # a count shard's partition key, before its number
COUNT = "in_flight"
COUNT_SHARDS = 8  # 8 x 250 samples/s of count writes
SHARD_OF = "count_shard"  # on a marker: the count shard it was admitted on
WORKERS = "workers"
TAKEN_BY = "taken_by"  # on a marker: the worker whose sandbox holds the slot
# On a marker: its taker died with the job (its lease lapsed), and the state machine has not
# yet counted that lost sandbox. The slot stays, for the job's retry.
LOST = "lost"
CLAIM_LEASE = "lease_until"  # on a batched sample's marker: its claim's lease (claims.py)
# An untaken marker older than this has its execution looked at (the reaper): a job may wait
# for a worker that long only if capacity fell after it was admitted.
STALE_S = 600
SHARDS = 8  # marker partitions: admissions spread their writes over these
MARKERS = "admitted#"  # a marker partition's key, before its shard's number
CAPACITY_CACHE_S = 2.0  # the leases are read at most this often by one dispatcher
BATCH_GET = 100  # BatchGetItem's most keys
CONFLICT_RETRIES = 6
CONFLICT_PAUSE_S = 0.02  # the first retry's most; doubled each time
# Cancellation reasons that are no answer: another transaction on the count, a throttle.
RETRIED = {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}


class Contended(Exception):
    """The count item stayed contended through every retry."""


def count_shares(capacity: int) -> list[int]:
    """Each count shard's share of the pool's capacity: as even as whole slots allow."""
    return [capacity // COUNT_SHARDS + (k < capacity % COUNT_SHARDS) for k in range(COUNT_SHARDS)]


def room_shares(counts: list[int], capacity: int, elsewhere: int = 0) -> list[int]:
    """The shares admissions may fill now. A shard over its share (the pool shrank since its
    requests were admitted), and the unsharded count (`elsewhere`), hold slots that another
    shard's share also counts: that excess comes off the shares of shards with room (the last
    first, the same for every dispatcher that read the same counts), so that however many
    admit at once on what they read, the shards together never pass the capacity."""
    shares = count_shares(capacity)
    excess = elsewhere
    excess += sum(max(0, count - share) for count, share in zip(counts, shares, strict=True))
    for number in reversed(range(COUNT_SHARDS)):
        taken = min(excess, max(0, shares[number] - counts[number]))
        shares[number] -= taken
        excess -= taken
    return shares


def _count_key(number: int | None) -> dict[str, Any]:
    """A count shard's key; None: the count from before the shards (`pool`)."""
    return {PART: {"S": POOL if number is None else f"{POOL}#{number}"}, ID: {"S": COUNT}}


def shard(request_id: str) -> str:
    digest = hashlib.sha256(request_id.encode()).digest()
    return f"{MARKERS}{digest[0] % SHARDS}"


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

    def _partition(self, part: str, consistent: bool = False) -> list[dict[str, Any]]:
        """Every item under one partition key (`workers`, a marker shard)."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": PART},
            ExpressionAttributeValues={":p": {"S": part}},
            ConsistentRead=consistent,
        )
        return [item for page in pages for item in page.get("Items", [])]

    def _leases(self) -> list[dict[str, Any]]:
        """The workers' leases (an item a lease did not write is skipped, not a crash)."""
        items = self._partition(WORKERS, consistent=True)
        return [item for item in items if "slots" in item and "expires_at" in item]

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
        counts, legacy, _ = self._read_counts()
        return sum(counts) + legacy

    def _read_counts(self, marker_of: str | None = None) -> tuple[list[int], int, bool]:
        """Each count shard's requests in flight, the unsharded count's (requests admitted
        before the count was sharded: it only drains), and whether `marker_of` (a request
        id) has its marker, in one consistent BatchGetItem."""
        counts, legacy, marked = [0] * COUNT_SHARDS, 0, False
        keys = [_count_key(k) for k in range(COUNT_SHARDS)] + [_count_key(None)]
        if marker_of is not None:
            keys.append(self._key(shard(marker_of), marker_of))
        request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
        while request:
            answer = self.dynamodb.batch_get_item(RequestItems=request)
            for item in answer["Responses"].get(self.table, []):
                part = item[PART]["S"]
                if part.startswith(MARKERS):
                    marked = True
                elif part == POOL:
                    legacy = int(item[COUNT]["N"])
                else:
                    counts[int(part.rsplit("#", 1)[1])] = int(item[COUNT]["N"])
            request = answer.get("UnprocessedKeys") or {}
        return counts, legacy, marked

    # The dispatcher's side --------------------------------------------------------------
    def admit(self, request_id: str, again: bool = False) -> bool:
        """Admit the request if a slot is free; True as well when it was admitted before (a
        redelivered message: its execution may already run). A full pool is seen by a read,
        not a write: a dispatcher waiting for a slot asks ten times a second, `again`, and
        only its first ask reads the marker too, with the counts (a redelivery's is there
        from the start)."""
        return self.admit_new(request_id, again) is not None

    def admit_new(self, request_id: str, again: bool = False) -> bool | None:
        """As `admit`: True, admitted now; False, admitted before (a redelivery); None, not
        admitted (the pool is full)."""
        capacity = self.capacity()
        marker_of = None if again else request_id
        for _ in range(COUNT_SHARDS):  # a shard another dispatcher filled meanwhile: read again
            counts, legacy, marked = self._read_counts(marker_of)
            if marked:
                return False
            if sum(counts) + legacy >= capacity:
                return None
            marker_of = None  # read once; the transaction's condition checks it from now
            admitted = self._admit_on(request_id, counts, room_shares(counts, capacity, legacy))
            if admitted is not None:
                return admitted
        return None

    def _admit_on(self, request_id: str, counts: list[int], shares: list[int]) -> bool | None:
        """One try, on a shard with room under `shares` (room_shares: one exists while the
        sum is below the capacity). None: another dispatcher filled that shard meanwhile."""
        number = random.choice([k for k in range(COUNT_SHARDS) if counts[k] < shares[k]])
        update = {
            "TableName": self.table,
            "Key": _count_key(number),
            "UpdateExpression": "SET #n = if_not_exists(#n, :zero) + :one",
            # The count's first write too: a pool of no slot admits nothing.
            "ConditionExpression": (
                "(attribute_not_exists(#n) AND :zero < :capacity) OR #n < :capacity"
            ),
            "ExpressionAttributeNames": {"#n": COUNT},
            "ExpressionAttributeValues": {
                ":zero": {"N": "0"},
                ":one": {"N": "1"},
                ":capacity": {"N": str(shares[number])},
            },
        }
        marker = {
            "TableName": self.table,
            "Item": self._key(shard(request_id), request_id)
            | {"at": {"N": repr(time.time())}, SHARD_OF: {"N": str(number)}},
            "ConditionExpression": "attribute_not_exists(#i)",
            "ExpressionAttributeNames": {"#i": ID},
        }
        try:
            reasons = self._transact([{"Update": update}, {"Put": marker}])
        except Contended:
            return None  # not now: the dispatcher asks again
        if reasons is None:
            return True
        return False if reasons[1] == "ConditionalCheckFailed" else None

    def _marker(self, request_id: str) -> dict[str, Any] | None:
        answer = self.dynamodb.get_item(
            TableName=self.table,
            Key=self._key(shard(request_id), request_id),
            ConsistentRead=True,
        )
        item: dict[str, Any] | None = answer.get("Item")
        return item

    def take(self, request_id: str, worker: str) -> Held | None:
        """A worker took the request's job: from now its slot is the worker's to give back,
        once its sandbox is done (not when the request's result exists: a cancelled
        request's sandbox may run on). None when the request holds no slot; else the marker
        as taken, which its release needs (it then reads nothing first)."""
        marker = self.update_marker(
            request_id,
            "SET #t = :w REMOVE #l",
            "attribute_exists(#i)",
            {"#t": TAKEN_BY, "#i": ID, "#l": LOST},
            {":w": {"S": worker}},
            returned="ALL_NEW",
        )
        return None if marker is None else Held(_count_shard(marker))

    def update_marker(
        self,
        request_id: str,
        expression: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
        returned: str = "NONE",
    ) -> dict[str, Any] | None:
        """A conditional update of the request's marker: None when its condition failed, else
        the attributes `returned` (DynamoDB's ReturnValues). `names` may hold more than the
        expressions use: only those used are sent."""
        names = {name: attr for name, attr in names.items() if name in expression + condition}
        try:
            answer = self.dynamodb.update_item(
                TableName=self.table,
                Key=self._key(shard(request_id), request_id),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues=returned,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            raise
        attributes: dict[str, Any] = answer.get("Attributes", {})
        return attributes

    def release(
        self,
        request_id: str,
        *,
        worker: str | None = None,
        force: bool = False,
        held: Held | None = None,
    ) -> bool:
        """Give the request's slot back; False when it held none, or not for this caller: a
        worker (`worker`) releases what it took (`held`: as `take` answered, or None: the
        marker is read first); Record and the DLQ's consumer (no `worker`) only what no
        worker took; the reaper (`force`) what it found stale."""
        if held is not None:
            number = held.count_shard
        else:  # no marker: the transaction's condition says so
            number = _count_shard(self._marker(request_id) or {})
        # The marker as it was read: a release racing a new admission of the same id (on
        # another shard) must not delete that one's marker against this shard's count.
        condition, values = "attribute_exists(#i) AND ", {}
        names = {"#i": ID, "#s": SHARD_OF}
        if number is None:
            condition += "attribute_not_exists(#s)"
        else:
            condition += "#s = :s"
            values[":s"] = {"N": str(number)}
        if not force:
            names["#t"] = TAKEN_BY
            if worker is None:
                condition += " AND attribute_not_exists(#t)"
            else:
                condition += " AND #t = :w"
                values[":w"] = {"S": worker}
        delete: dict[str, Any] = {
            "TableName": self.table,
            "Key": self._key(shard(request_id), request_id),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
        }
        if values:
            delete["ExpressionAttributeValues"] = values
        update = {
            "TableName": self.table,
            "Key": _count_key(number),
            "UpdateExpression": "SET #n = #n - :one",
            "ConditionExpression": "#n > :zero",
            "ExpressionAttributeNames": {"#n": COUNT},
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":zero": {"N": "0"}},
        }
        reasons = self._transact([{"Delete": delete}, {"Update": update}])
        if reasons is None:
            return True
        if reasons[0] == "ConditionalCheckFailed":
            return False
        # A marker with a count of 0 (a count reset by hand): the marker alone goes.
        try:
            self.dynamodb.delete_item(**delete)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _transact(self, items: list[dict[str, Any]]) -> list[str] | None:
        """None when written; else each item's reason the transaction was cancelled ('None'
        where its check held). Every admission and release writes the one count item, so two
        at once conflict (TransactionConflict): tried again, with jitter, CONFLICT_RETRIES
        times, then Contended."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.dynamodb.transact_write_items(TransactItems=items)
                return None
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "TransactionCanceledException":
                    raise
                reasons = exc.response.get("CancellationReasons") or []
                codes = [str(reason.get("Code", "None")) for reason in reasons]
                if len(codes) == len(items) and not RETRIED & set(codes):
                    return codes
            time.sleep(random.uniform(0, CONFLICT_PAUSE_S * 2**attempt))
        raise Contended(f"{self.table}: {CONFLICT_RETRIES} transactions in a row conflicted")

    # The reaper's side ------------------------------------------------------------------
    def admitted(self) -> dict[str, Marker]:
        """Every admitted request's marker, by request id."""
        found: dict[str, Marker] = {}
        for number in range(SHARDS):
            for item in self._partition(f"{MARKERS}{number}"):
                if "at" not in item:  # not a marker admission wrote (a stray client update)
                    continue
                taken = item.get(TAKEN_BY, {}).get("S")
                batch = item.get("batch", {}).get("S")  # a batched sample's (batching.BATCH)
                found[item[ID]["S"]] = Marker(float(item["at"]["N"]), taken, batch)
        return found

    def reconcile(self, results_table: str, ended: EndedCheck) -> list[str]:
        """Give back the slots nobody else will (the reaper, each minute); the released ids.
        - a slot a worker took is its own to give back. If that worker's lease lapsed (it
          died with the job), the marker says the job was lost and no longer names it: the
          slot stays for the job's retry (the state machine counts the lost sandbox once,
          and the retry's waits are waits), and is then as any slot no worker holds:
        - a slot no worker holds, of a request with its terminal result (an execution that
          ended without Record's release: a cancel stops it);
        - a slot no worker holds, admitted over STALE_S ago, whose execution `ended` says is
          over without a result (stopped by hand, or Record's own fallback failed): `ended`
          writes its `sandbox_error` result first.
        And lapsed leases are deleted."""
        markers = self.admitted()
        now = time.time()
        leases = self._leases()
        live = {item[ID]["S"] for item in leases if float(item["expires_at"]["N"]) > now}
        for request_id, marker in list(markers.items()):
            dead = marker.taken_by is not None and marker.taken_by not in live
            if dead and self._lost(request_id, str(marker.taken_by)):
                markers[request_id] = Marker(marker.at, None, marker.batch)
        untaken = [rid for rid, m in markers.items() if m.taken_by is None]
        recorded: set[str] = set()
        for start in range(0, len(untaken), BATCH_GET):
            batch = untaken[start : start + BATCH_GET]
            recorded |= set(with_results(self.dynamodb, results_table, batch))
        released = []
        for request_id, marker in markers.items():
            if marker.taken_by is not None:
                continue  # its live worker gives it back
            stale = request_id in recorded
            if not stale and now - marker.at > STALE_S:
                stale = ended(request_id, marker.batch or request_id)
            if stale and self.release(request_id, force=True):
                released.append(request_id)
        for item in leases:
            if float(item["expires_at"]["N"]) <= now:
                _delete_lapsed(self.dynamodb, self.table, item, now)
        return released

    def _lost(self, request_id: str, worker: str) -> bool:
        """The marker's taker died with the job: say so, and name it no longer (unless
        another worker took the job meanwhile, or a batched sample's claim says its holder is
        alive: its own lease, trialbox.pipeline.claims, is the word on it)."""
        return None is not self.update_marker(
            request_id,
            "SET #l = :yes REMOVE #t",
            "#t = :w AND (attribute_not_exists(#u) OR #u < :now)",
            {"#t": TAKEN_BY, "#l": LOST, "#u": CLAIM_LEASE},
            {":w": {"S": worker}, ":yes": {"BOOL": True}, ":now": {"N": repr(time.time())}},
        )


@dataclass(frozen=True)
class Held:
    """A marker a worker took: the count shard its admission went on (None: the unsharded
    count's, a marker from before the count was sharded)."""

    count_shard: int | None


def _count_shard(marker: dict[str, Any]) -> int | None:
    return int(marker[SHARD_OF]["N"]) if SHARD_OF in marker else None


@dataclass(frozen=True)
class Marker:
    at: float  # when it was admitted (epoch s)
    taken_by: str | None  # the worker that took its job
    batch: str | None = None  # the execution that carries it, when it is a batch's


# (request id, its execution's name) -> whether that execution is over without the request's
# result (after writing one for it).
EndedCheck = Callable[[str, str], bool]


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


def with_results(dynamodb: Any, table: str, request_ids: list[str]) -> list[str]:
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
