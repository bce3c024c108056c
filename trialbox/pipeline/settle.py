"""A batch's Settle step: its Run failed or timed out (a backstop: each sample's liveness is its
claim's), so every sample of the batch still without a result gets its `sandbox_error`, with
the error that ended Run. A sample with a result keeps it, and its trace."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox.models.batches import BatchInput
from trialbox.models.jobs import StepError
from trialbox.pipeline.admission import BATCH_GET, with_results
from trialbox.pipeline.recorder import Recorder, RecordInput


@dataclass
class Settler:
    recorder: Recorder

    def __call__(self, batch: BatchInput, error: StepError) -> list[str]:
        """The ids this call gave a result."""
        ids = batch.request_ids
        table = self.recorder.table
        done: set[str] = set()
        for start in range(0, len(ids), BATCH_GET):
            done |= set(with_results(table.dynamodb, table.table, ids[start : start + BATCH_GET]))
        written = []
        for request_id in ids:
            if request_id in done:
                continue
            if self.recorder(RecordInput(request_id=request_id, error=error)).written:
                written.append(request_id)
        return written
