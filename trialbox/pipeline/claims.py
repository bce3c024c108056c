"""A sample's own liveness and idempotency inside a batch: a claim with a lease, kept on the
sample's admission marker (trialbox.pipeline.admission), so that one execution can carry many
samples and each still has what Step Functions gave it alone (docs/batches.md).

- `claim`: a worker takes the sample's job. It wins only a marker no one holds, or one whose
  holder's lease lapsed (it died: the job's message came back into view), and then the attempt
  counts one more lost sandbox. A sample cancelled, already finished (no marker: its slot went
  back after its result), or lost past its retries is never run.
- `renew`: the holder keeps its lease while its sandbox runs. It fails once the sample moved
  on: taken over, cancelled, or past the job's own deadline (what Execute's TimeoutSeconds
  was): the worker then drops the run.
- `cancel`: the client's flag on the marker.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from trialbox.constants import LOST_SANDBOX_RETRIES
from trialbox.pipeline.admission import CLAIM_LEASE, ID, LOST, PART, TAKEN_BY, Admission, shard

ATTEMPT = "attempt"  # lost sandboxes before the current claim
LEASE_UNTIL = CLAIM_LEASE  # epoch s: the holder is alive until then, unless it renews
DEADLINE = "deadline"  # epoch s: the current attempt's budget, as Execute's TimeoutSeconds
CANCELLED = "cancelled"
FINISHED = "finished"  # the holder that ran it to the end, before the finisher records it
CLAIM_TRIES = 4  # claims lost to another worker's claim, in a row, before giving up


def lease_s(heartbeat_s: float) -> float:
    """A claim's lease: two heartbeats (renewed every third of one), so one late renewal never
    loses it, and a dead holder's sample is taken over within 3 x the heartbeat."""
    return 2.0 * heartbeat_s


class Refused(enum.Enum):
    GONE = "gone"  # no marker: the sample finished (or was never admitted)
    CANCELLED = "cancelled"
    HELD = "held"  # another worker holds a live lease on it
    EXHAUSTED = "exhausted"  # its sandbox was lost LOST_SANDBOX_RETRIES + 1 times
    FINISHED = "finished"  # run to its end; its result is on its way to the finisher


class Moved(enum.Enum):
    """Why a holder's renewal (or finish) failed: what it does with its run."""

    GONE = "gone"  # finished, by another copy: drop the run
    CANCELLED = "cancelled"  # drop the run; tell the finisher, which gives the slot back
    TAKEN_OVER = "taken_over"  # another holder runs it: drop the run, leave the message
    LAPSED = "lapsed"  # still its own, past its deadline or lease: give it up to a retry


@dataclass(frozen=True)
class Claim:
    request_id: str
    worker: str
    attempt: int  # lost sandboxes before this one


@dataclass
class Claims:
    dynamodb: Any
    table: str
    lease_s: float  # how long a claim or a renewal keeps the holder alive

    def __post_init__(self) -> None:
        self._markers = Admission(self.dynamodb, self.table)

    def _key(self, request_id: str) -> dict[str, Any]:
        return {PART: {"S": shard(request_id)}, ID: {"S": request_id}}

    def claim(
        self, request_id: str, worker: str, budget_s: float, now: float | None = None
    ) -> Claim | Refused:
        """The job is this worker's to run, or why not."""
        for _ in range(CLAIM_TRIES):
            now = time.time() if now is None else now
            item = self._read(request_id)
            if item is None:
                return Refused.GONE
            if FINISHED in item:
                return Refused.FINISHED
            if CANCELLED in item:
                return Refused.CANCELLED
            holder = item.get(TAKEN_BY, {}).get("S")
            attempt = int(item.get(ATTEMPT, {}).get("N", "0"))
            lost = LOST in item  # the reaper found its holder's worker dead
            if holder is not None and float(item[LEASE_UNTIL]["N"]) > now:
                return Refused.HELD
            if holder is not None or lost:
                attempt += 1  # its holder died with it: a lost sandbox
                if attempt > LOST_SANDBOX_RETRIES:
                    return Refused.EXHAUSTED
            seen = item.get(LEASE_UNTIL, {}).get("N")  # the lapsed lease it takes over
            if self._take(request_id, worker, holder, lost, seen, attempt, budget_s, now):
                return Claim(request_id, worker, attempt)
            now = None  # another worker's claim won the race: read it again
        return Refused.HELD

    def _read(self, request_id: str) -> dict[str, Any] | None:
        answer = self.dynamodb.get_item(
            TableName=self.table, Key=self._key(request_id), ConsistentRead=True
        )
        item: dict[str, Any] | None = answer.get("Item")
        return item

    def _take(
        self,
        request_id: str,
        worker: str,
        holder: str | None,
        lost: bool,
        seen: str | None,
        attempt: int,
        budget_s: float,
        now: float,
    ) -> bool:
        """The conditional write: the marker as it was read (its holder or none, lost or not),
        not cancelled meanwhile. The lost flag goes: this claim counted it."""
        names = {
            "#t": TAKEN_BY, "#a": ATTEMPT, "#l": LEASE_UNTIL, "#d": DEADLINE, "#c": CANCELLED,
            "#x": LOST,
        }  # fmt: skip
        values: dict[str, Any] = {
            ":w": {"S": worker},
            ":a": {"N": str(attempt)},
            ":l": {"N": repr(now + self.lease_s)},
            ":d": {"N": repr(now + budget_s)},
        }
        if holder is None:
            held = "attribute_not_exists(#t)"
        else:
            # The lease as it was read, lapsed: a holder that renewed meanwhile keeps it.
            held, values[":h"] = "#t = :h AND #a = :was AND #l = :seen", {"S": holder}
            values[":was"] = {"N": str(attempt - 1)}
            values[":seen"] = {"N": str(seen)}
        held += " AND attribute_exists(#x)" if lost else " AND attribute_not_exists(#x)"
        return None is not self._markers.update_marker(
            request_id,
            "SET #t = :w, #a = :a, #l = :l, #d = :d REMOVE #x",
            f"attribute_exists({ID}) AND attribute_not_exists(#c) AND {held}",
            names,
            values,
        )

    def renew(self, claim: Claim, now: float | None = None) -> bool:
        """Keep the lease; False when the sample moved on (taken over, cancelled, finished, or
        past its deadline): the holder drops its run."""
        now = time.time() if now is None else now
        return self._still_held(claim, "SET #l = :l", {":l": {"N": repr(now + self.lease_s)}}, now)

    def finish(self, claim: Claim, now: float | None = None) -> bool:
        """The holder ran the sample to its end: the last word on whose run it is (as a
        renewal), and from now no claim takes it over, whatever copies of its message come
        while the finisher has not recorded it yet. False: it moved on; drop the run."""
        now = time.time() if now is None else now
        return self._still_held(claim, "SET #f = :w", {}, now)

    def _still_held(
        self, claim: Claim, expression: str, values: dict[str, Any], now: float
    ) -> bool:
        """An update the holder makes while its claim is its own: not taken over, not
        cancelled, within its deadline."""
        return None is not self._markers.update_marker(
            claim.request_id,
            expression,
            "#t = :w AND #a = :a AND attribute_not_exists(#c) AND #d > :now",
            {
                "#t": TAKEN_BY,
                "#a": ATTEMPT,
                "#l": LEASE_UNTIL,
                "#d": DEADLINE,
                "#c": CANCELLED,
                "#f": FINISHED,
            },
            values
            | {
                ":w": {"S": claim.worker},
                ":a": {"N": str(claim.attempt)},
                ":now": {"N": repr(now)},
            },
        )

    def why_not(self, claim: Claim) -> Moved:
        """Why `claim` can no longer be renewed or finished, read from its marker."""
        item = self._read(claim.request_id)
        if item is None or FINISHED in item:
            return Moved.GONE
        if CANCELLED in item:
            return Moved.CANCELLED
        holder = item.get(TAKEN_BY, {}).get("S")
        if holder != claim.worker or int(item.get(ATTEMPT, {}).get("N", "0")) != claim.attempt:
            return Moved.TAKEN_OVER
        return Moved.LAPSED

    def give_up(self, claim: Claim) -> bool:
        """Its lease ends now: the next claim takes the sample over, a lost sandbox."""
        return None is not self._markers.update_marker(
            claim.request_id,
            "SET #l = :zero",
            "#t = :w AND #a = :a",
            {"#t": TAKEN_BY, "#a": ATTEMPT, "#l": LEASE_UNTIL},
            {":w": {"S": claim.worker}, ":a": {"N": str(claim.attempt)}, ":zero": {"N": "0"}},
        )

    def cancel(self, request_id: str) -> bool:
        """Flag the sample cancelled; False when it holds no marker (not admitted yet, or
        finished)."""
        return None is not self._markers.update_marker(
            request_id,
            "SET #c = :yes",
            f"attribute_exists({ID})",
            {"#c": CANCELLED},
            {":yes": {"BOOL": True}},
        )
