"""The Score step: the raw run report and the job's grading spec in, the typed result out.
The sandbox never scores itself."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox.keys import job_key
from trialbox.models import RunReport, Timings
from trialbox.models.jobs import ExecutionDone, JobRef, JobSpec, ScoreRef
from trialbox.pipeline.stores import ObjectStore
from trialbox.scoring import score


@dataclass
class Scorer:
    jobs: ObjectStore

    def __call__(self, job_ref: JobRef, done: ExecutionDone) -> ScoreRef:
        return self.score(job_ref.job_uri, done)

    def score(self, job_uri: str, done: ExecutionDone) -> ScoreRef:
        job = JobSpec.model_validate_json(self.jobs.get_bytes(job_uri))
        report = RunReport.model_validate_json(self.jobs.get_bytes(done.report_uri))
        result = score(job.task.grading, report, request_id=job.request_id)
        timings = Timings(
            queued_at=job.queued_at, started_at=done.started_at, finished_at=done.finished_at
        )
        result = result.model_copy(
            update={"sample_id": job.sample_id, "timings": timings, "attempts": done.attempt + 1}
        )
        uri = self.jobs.put_json(job_key(job.request_id, "result.json"), result)
        return ScoreRef(result_uri=uri, status=result.status.value, reward=result.reward)
