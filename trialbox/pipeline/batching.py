"""The dispatcher's batch: the requests one invocation admitted, started as one execution
(docs/batches.md). Each sample's marker names the batch that carries it, before the batch
starts, so a redelivered request finds it:
- in a batch that started: left to it (its sample runs once);
- in a batch that never started (the dispatcher died between the two): adopted by the next.
The batch's id is a digest of its request ids, so the same messages redelivered together
start the same execution once (StartExecution is idempotent by name).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from trialbox.keys import execution_arn
from trialbox.models.batches import BatchInput
from trialbox.models.jobs import RolloutInput
from trialbox.pipeline.admission import ID, PART, shard
from trialbox.pipeline.stores import ObjectStore

BATCH = "batch"  # on a marker: the batch that carries the sample
BATCHES_PREFIX = "batches/"


def batch_id(request_ids: list[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(request_ids)).encode()).hexdigest()
    return f"b-{digest[:40]}"


@dataclass
class BatchStarter:
    sfn: Any
    dynamodb: Any
    admission_table: str
    rollout_arn: str
    requests: ObjectStore
    _rollouts: list[RolloutInput] = field(default_factory=list)

    def carried_by(self, request_id: str) -> str | None:
        """The batch a sample's marker names, if that batch started; None: it is free to be
        carried (no batch named, or one that never started)."""
        answer = self.dynamodb.get_item(
            TableName=self.admission_table,
            Key={PART: {"S": shard(request_id)}, ID: {"S": request_id}},
            ConsistentRead=True,
            ProjectionExpression="#b",
            ExpressionAttributeNames={"#b": BATCH},
        )
        named = answer.get("Item", {}).get(BATCH, {}).get("S")
        if named is None:
            return None
        try:
            self.sfn.describe_execution(executionArn=execution_arn(self.rollout_arn, named))
        except self.sfn.exceptions.ExecutionDoesNotExist:
            return None
        return str(named)

    def add(self, rollout: RolloutInput) -> None:
        self._rollouts.append(rollout)

    def start(self) -> str | None:
        """Start what was added as one execution, and forget it; its id (None: nothing)."""
        rollouts, self._rollouts = self._rollouts, []
        if not rollouts:
            return None
        ids = [r.request_id for r in rollouts]
        name = batch_id(ids)
        body = "[" + ",".join(r.model_dump_json(exclude_none=True) for r in rollouts) + "]"
        uri = self.requests.put_bytes(
            f"{BATCHES_PREFIX}{name}.json", body.encode(), "application/json"
        )
        for request_id in ids:
            self._name(request_id, name)
        batch = BatchInput(batch_id=name, requests_uri=uri, request_ids=ids)
        # The same messages, redelivered together: started once.
        with contextlib.suppress(self.sfn.exceptions.ExecutionAlreadyExists):
            self.sfn.start_execution(
                stateMachineArn=self.rollout_arn, name=name, input=batch.model_dump_json()
            )
        return name

    def _name(self, request_id: str, name: str) -> None:
        """The marker names the batch (it was admitted: it exists)."""
        try:
            self.dynamodb.update_item(
                TableName=self.admission_table,
                Key={PART: {"S": shard(request_id)}, ID: {"S": request_id}},
                UpdateExpression="SET #b = :b",
                ConditionExpression=f"attribute_exists({ID})",
                ExpressionAttributeNames={"#b": BATCH},
                ExpressionAttributeValues={":b": {"S": name}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
