"""Scoring a run: the raw run report and the job's grading spec in, the typed result out. Record
(and a batch's finisher) score what a worker answered, in the same call that records it. The
sandbox never scores itself."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox.models import ExecutionResult, RunReport, Timings
from trialbox.models.jobs import ExecutionDone, JobSpec
from trialbox.pipeline.stores import ObjectStore
from trialbox.scoring import score


@dataclass
class Scorer:
    jobs: ObjectStore

    def score(self, job_uri: str, done: ExecutionDone) -> ExecutionResult:
        job = JobSpec.model_validate_json(self.jobs.get_bytes(job_uri))
        report = RunReport.model_validate_json(self.jobs.get_bytes(done.report_uri))
        result = score(job.task.grading, report, request_id=job.request_id)
        timings = Timings(
            queued_at=job.queued_at, started_at=done.started_at, finished_at=done.finished_at
        )
        return result.model_copy(
            update={"sample_id": job.sample_id, "timings": timings, "attempts": done.attempt + 1}
        )
