"""`python -m trialbox.worker`: the Fargate entrypoint. SIGTERM finishes the current job, or
hands it back to the state machine before the container's stop timeout. After
TRIALBOX_RECYCLE_AFTER_JOBS jobs (1 when unset: a fresh task per job), or as soon as the
wipe between jobs leaves anything, it exits 0 and ECS starts a fresh task."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import boto3

from trialbox import constants as c
from trialbox.pipeline.stores import ObjectStore
from trialbox.sandbox.runner import Runner
from trialbox.worker.loop import Worker
from trialbox.worker.run import job_runner


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    runner = Runner()
    worker = Worker(
        sqs=boto3.client("sqs"),
        sfn=boto3.client("stepfunctions"),
        jobs=ObjectStore(boto3.client("s3"), os.environ[c.ENV_TRACES_BUCKET]),
        queue_url=os.environ[c.ENV_WORK_QUEUE_URL],
        run_job=job_runner(runner),
        heartbeat_s=int(os.environ.get(c.ENV_HEARTBEAT_S, "60")),
        name=socket.gethostname(),
        recycle_after_jobs=int(os.environ.get(c.ENV_RECYCLE_AFTER_JOBS, "1")),
        residue=runner.residue,
    )
    # ECS sends SIGTERM, then SIGKILL after the container's stop timeout: finish the job in
    # hand, or hand it back before the kill.
    grace_s = float(os.environ.get(c.ENV_STOP_GRACE_S, "90"))
    signal.signal(signal.SIGTERM, lambda *_: worker.shut_down(grace_s))
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
