"""The finisher: a batched sample's Score and Record, outside its batch's execution, then its
place in the batch's ledger (docs/batches.md). A finish message may come twice: scoring is
pure, the result's put is conditional (the first one wins), the ledger's set adds an id once."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox.constants import ERROR_SANDBOX
from trialbox.models.batches import Finished
from trialbox.models.jobs import ExecutionDone, ScoreRef, StepError
from trialbox.pipeline.batches import Ledger
from trialbox.pipeline.recorder import Recorded, Recorder, RecordInput
from trialbox.pipeline.score import Scorer

SCORE_FAILED = "Score.Failed"


@dataclass
class Finisher:
    scorer: Scorer
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
        score, error = self._score(done)
        state = RecordInput(
            request_id=done.request_id,
            content_sha256=done.content_sha256,  # a reuse of its id with other content: refused
            score=score,
            error=error,
            job={"batch_id": done.batch_id, "job_uri": done.job_uri},
            execution=done.model_dump(mode="json"),
        )
        recorded = self.recorder(state, holder=done.worker)
        self.ledger.finish(done.batch_id, done.request_id)
        return recorded

    def _score(self, done: Finished) -> tuple[ScoreRef | None, StepError | None]:
        if done.outcome != "report" or done.report_uri is None:
            return None, StepError(Error=done.error or ERROR_SANDBOX, Cause=done.cause)
        ran = ExecutionDone(
            report_uri=done.report_uri,
            worker=done.worker,
            started_at=done.started_at,
            finished_at=done.finished_at,
            attempt=done.attempt,
        )
        try:
            return self.scorer.score(done.job_uri, ran), None
        except Exception as exc:  # as Score's Catch into Record: the request still ends
            return None, StepError(Error=SCORE_FAILED, Cause=f"{type(exc).__name__}: {exc}")
