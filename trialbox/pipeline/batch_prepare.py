"""A batch's Run step: prepare every sample (each distinct task set read once), record the
rejected ones, send one work message per sample, and hand the batch's ledger the token its
execution waits on (docs/batches.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trialbox.constants import ERROR_REJECTED
from trialbox.errors import RequestRejected
from trialbox.models.batches import BatchInput, BatchWork
from trialbox.models.jobs import RolloutInput, StepError
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.prepare import Preparer
from trialbox.pipeline.recorder import Recorder, RecordInput
from trialbox.pipeline.stores import ObjectStore

SEND_BATCH = 10  # SendMessageBatch's most entries
SEND_TRIES = 5  # a batch's failed entries are sent again this many times, then it raises


class NotSent(Exception):
    """Work messages SQS would not take through every try: Run fails, and is retried."""


@dataclass
class BatchPreparer:
    prepare: Preparer
    recorder: Recorder
    ledger: Ledger
    requests: ObjectStore  # where the dispatcher put the batch's requests
    sqs: Any
    work_queue: str

    def __call__(self, batch: BatchInput, token: str) -> None:
        rollouts = [
            RolloutInput.model_validate(raw)
            for raw in json.loads(self.requests.get_bytes(batch.requests_uri))
        ]
        works: list[BatchWork] = []
        for rollout in rollouts:
            try:
                job = self.prepare(rollout)
            except RequestRejected as exc:
                self.recorder(
                    RecordInput(
                        request_id=rollout.request_id,
                        content_sha256=rollout.content_sha256,
                        error=StepError(Error=ERROR_REJECTED, Cause=str(exc)),
                    )
                )
                self.ledger.finish(batch.batch_id, rollout.request_id)
                continue
            # The claim's deadline starts when a worker takes the job: no wait is in it.
            works.append(
                BatchWork(
                    batch_id=batch.batch_id,
                    request_id=job.request_id,
                    job_uri=job.job_uri,
                    budget_s=job.timeout_s - job.heartbeat_s,
                    content_sha256=rollout.content_sha256,
                )
            )
        for start in range(0, len(works), SEND_BATCH):
            self._send(works[start : start + SEND_BATCH])
        self.ledger.open(batch.batch_id, len(rollouts), token)

    def _send(self, works: list[BatchWork]) -> None:
        entries = {str(n): work.model_dump_json() for n, work in enumerate(works)}
        for _ in range(SEND_TRIES):
            answer = self.sqs.send_message_batch(
                QueueUrl=self.work_queue,
                Entries=[{"Id": n, "MessageBody": body} for n, body in entries.items()],
            )
            entries = {f["Id"]: entries[f["Id"]] for f in answer.get("Failed", [])}
            if not entries:
                return
        raise NotSent(f"{len(entries)} work message(s) not sent after {SEND_TRIES} tries")
