"""`python -m trialbox.worker`: the Fargate entrypoint. SIGTERM finishes the current job, or
hands it back to the state machine before the container's stop timeout. After
TRIALBOX_RECYCLE_AFTER_JOBS jobs, or as soon as the wipe between jobs leaves anything, it
exits 0 and ECS starts a fresh task. Settings: `trialbox.settings.WorkerSettings`."""

from __future__ import annotations

import logging
import signal
import sys

import boto3

from trialbox import aws_retries
from trialbox.pipeline.admission import Admission
from trialbox.pipeline.claims import Claims, lease_s
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import Runner
from trialbox.settings import WorkerSettings
from trialbox.worker.batched import BatchedJobs
from trialbox.worker.identity import worker_name
from trialbox.worker.loop import Worker
from trialbox.worker.metrics import report_held_sessions
from trialbox.worker.protection import TaskProtection
from trialbox.worker.run import job_runner
from trialbox.worker.sessions import SessionHost


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = WorkerSettings.from_env()
    runner = Runner()
    retries = aws_retries.config()  # a throttled callback must not become a lost sandbox
    jobs = ObjectStore(boto3.client("s3", config=retries), settings.traces_bucket)
    sqs = boto3.client("sqs", config=retries)
    name = worker_name(settings.name, settings.ecs_metadata_uri)
    dynamodb = boto3.client("dynamodb", config=retries)
    claims = Claims(dynamodb, settings.admission_table, lease_s(settings.heartbeat_s))
    sessions = SessionHost(
        runner,
        sqs,
        jobs,
        name,
        TaskProtection(settings.ecs_agent_uri),
        queue_prefix=settings.session_queue_prefix,
    )
    worker = Worker(
        sqs=sqs,
        sfn=boto3.client("stepfunctions", config=retries),
        jobs=jobs,
        queue_url=settings.work_queue_url,
        run_job=job_runner(runner, jobs),
        heartbeat_s=settings.heartbeat_s,
        name=name,
        recycle_after_jobs=settings.recycle_after_jobs,
        residue=runner.residue,
        sessions=sessions,
        open_queue_url=settings.open_queue_url,
        admission=Admission(dynamodb, settings.admission_table),
        batched=BatchedJobs(
            sqs,
            settings.work_queue_url,
            settings.finish_queue_url,
            claims,
            settings.heartbeat_s,
            name,
        ),
    )
    # ECS sends SIGTERM, then SIGKILL after the container's stop timeout: finish the job in
    # hand, or hand it back before the kill.
    signal.signal(signal.SIGTERM, lambda *_: worker.shut_down(settings.stop_grace_s))
    if settings.pool_name:
        report_held_sessions(settings.pool_name, sessions.held, worker.stop)
    try:
        worker.serve()
    finally:
        sessions.stop()  # its inbox goes with it
    return 0


if __name__ == "__main__":
    sys.exit(main())
