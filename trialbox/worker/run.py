"""How a worker runs one job: the sandbox runner, with the job's limits."""

from __future__ import annotations

from trialbox.models import RunReport
from trialbox.models.jobs import JobSpec
from trialbox.sandbox.runner import Runner
from trialbox.worker.loop import RunJob


def job_runner(runner: Runner) -> RunJob:
    def run(job: JobSpec) -> RunReport:
        return runner.run(job.task, job.sample(), limits=job.limits, grade=job.grade)

    return run
