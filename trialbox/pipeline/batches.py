"""A batch's ledger: which of its samples have their result, and the task token its execution
waits on (docs/batches.md). One item in the admission table, (`batch#<shard>`, batch id):
- `size`: how many samples the batch carries;
- `token`: the Run step's current task token (a retried Run replaces it);
- `done`: the ids whose result is written (a string set: adding one twice is adding it once).
The sample whose `done` completes the set answers the token; so does a Run retried after the
last one finished.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from trialbox.pipeline.admission import ID, PART, SHARDS

BATCHES = "batch"
SIZE = "size"
TOKEN = "token"
DONE = "done"
TTL = "expires_at"
# Gone tokens (the execution ended, or a later Run attempt holds another): nothing to answer.
GONE = {"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"}
KEEP_S = 7 * 86400  # a ledger outlives its execution by this much (DynamoDB TTL)


@dataclass
class Ledger:
    dynamodb: Any
    sfn: Any
    table: str

    def _key(self, batch_id: str) -> dict[str, Any]:
        """Spread over SHARDS partitions, as the markers are: no hot key at scale."""
        number = hashlib.sha256(batch_id.encode()).digest()[0] % SHARDS
        return {PART: {"S": f"{BATCHES}#{number}"}, ID: {"S": batch_id}}

    def open(self, batch_id: str, size: int, token: str) -> None:
        """Run's attempt holds `token` now; answered at once if every sample already has its
        result (an attempt retried after the last one finished)."""
        answer = self.dynamodb.update_item(
            TableName=self.table,
            Key=self._key(batch_id),
            UpdateExpression="SET #s = :s, #t = :t, #x = :x",
            ExpressionAttributeNames={"#s": SIZE, "#t": TOKEN, "#x": TTL},
            ExpressionAttributeValues={
                ":s": {"N": str(size)},
                ":t": {"S": token},
                ":x": {"N": str(int(time.time() + KEEP_S))},
            },
            ReturnValues="ALL_NEW",
        )
        self._answer_if_complete(answer["Attributes"])

    def finish(self, batch_id: str, request_id: str) -> bool:
        """The sample has its result; True when that completed the batch (and its token was
        answered, unless it is gone)."""
        answer = self.dynamodb.update_item(
            TableName=self.table,
            Key=self._key(batch_id),
            # Its TTL too: a sample may finish before Run opens the ledger, or Run never does.
            UpdateExpression="ADD #d :id SET #x = if_not_exists(#x, :x)",
            ExpressionAttributeNames={"#d": DONE, "#x": TTL},
            ExpressionAttributeValues={
                ":id": {"SS": [request_id]},
                ":x": {"N": str(int(time.time() + KEEP_S))},
            },
            ReturnValues="ALL_NEW",
        )
        return self._answer_if_complete(answer["Attributes"])

    def _answer_if_complete(self, item: dict[str, Any]) -> bool:
        if SIZE not in item or TOKEN not in item:  # Run has not opened it yet: it will look
            return False
        if len(item.get(DONE, {}).get("SS", [])) < int(item[SIZE]["N"]):
            return False
        try:
            self.sfn.send_task_success(taskToken=item[TOKEN]["S"], output="{}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in GONE:
                raise
        return True
