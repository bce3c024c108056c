"""How a worker runs one job: the sandbox runner, with the job's limits, from its base
checkpoint if it names one, saving the workspace after the commands if it asks."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from trialbox.models import RunReport, Status
from trialbox.models.jobs import JobSpec
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import Runner
from trialbox.worker.checkpoint_io import load_checkpoint, save_checkpoint

# How a worker runs one job (the runner, with its checkpoints): what the loop is given. The
# event is set once the run is no longer the job's (cancelled, taken over): its sandbox dies.
RunJob = Callable[[JobSpec, threading.Event], RunReport]


def job_runner(runner: Runner, store: ObjectStore) -> RunJob:
    def run(job: JobSpec, stop: threading.Event) -> RunReport:
        base = None if job.base_checkpoint is None else load_checkpoint(store, job.base_checkpoint)
        with tempfile.TemporaryDirectory(prefix="trialbox-checkpoint-") as scratch:
            saved = Path(scratch, "workspace.tar.gz") if job.checkpoint else None
            report = runner.run(
                job.task,
                job.sample(),
                limits=job.limits,
                grade=job.grade,
                checkpoint_to=saved,
                base_checkpoint=base,
                stop=stop,
            )
            if saved is None or report.status == Status.SANDBOX_ERROR or not saved.exists():
                return report
            return report.model_copy(
                update={"checkpoint": save_checkpoint(store, saved.read_bytes())}
            )

    return run
