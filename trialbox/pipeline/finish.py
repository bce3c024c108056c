"""The finisher: a batched sample's Score and Record, outside its batch's execution, then its
place in the batch's ledger (docs/batches.md). A finish message may come twice: scoring is
pure, the result's put is conditional (the first one wins), the ledger's set adds an id once."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox.constants import ERROR_SANDBOX
from trialbox.models.batches import Finished
from trialbox.models.jobs import ExecutionDone, StepError
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.recorder import Recorded, Recorder, RecordInput


@dataclass
class Finisher:
    recorder: Recorder
    ledger: Ledger

    def __call__(self, done: Finished) -> Recorded | None:
        """What was recorded; None for a sample not run whose result is another's to write
        (cancelled before a worker took it, or finished already): only its untaken slot goes
        back, and its batch counts it."""
        if done.outcome == "not_run" and done.error is None:
            # Untaken (cancelled before a claim), or its holder's (cancelled mid-run).
            self.recorder.admission.release(done.request_id, worker=done.worker)
            self.ledger.finish(done.batch_id, done.request_id)
            return None
        ran = _answer(done)
        error = None if ran else StepError(Error=done.error or ERROR_SANDBOX, Cause=done.cause)
        state = RecordInput(
            request_id=done.request_id,
            content_sha256=done.content_sha256,  # a reuse of its id with other content: refused
            error=error,
            job={"batch_id": done.batch_id, "job_uri": done.job_uri},
            execution=done.model_dump(mode="json"),
        )
        recorded = self.recorder.record(state, ran, holder=done.worker)
        self.ledger.finish(done.batch_id, done.request_id)
        return recorded


def _answer(done: Finished) -> ExecutionDone | None:
    """The run's answer, as Execute's would be, when the worker reported one."""
    if done.outcome != "report" or done.report_uri is None:
        return None
    return ExecutionDone(
        report_uri=done.report_uri,
        worker=done.worker,
        started_at=done.started_at,
        finished_at=done.finished_at,
        attempt=done.attempt,
    )
