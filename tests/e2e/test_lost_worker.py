"""A twin worker is a process (the Fargate entrypoint). One SIGKILLed mid-job is lost as a
Fargate task is: the pool starts a replacement, as ECS does; the job's heartbeat lapses,
Execute is retried (or its message comes back first), and the replacement produces the
correct result."""

from __future__ import annotations

import time
from pathlib import Path

import boto3

from tests.support.processes import cmdline, descendants
from tests.support.tasks import CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.sdk import Client, Resources


def test_a_worker_killed_mid_job_is_replaced_and_the_job_retried_to_a_correct_result() -> None:
    with LocalTwin(workers=1, heartbeat_s=5) as twin:  # the functions' least
        assert twin.pool is not None
        (doomed,) = twin.pool.pids()
        assert cmdline(doomed)[1:] == ["-m", "trialbox.worker"]
        client = Client(
            Resources.from_outputs(twin.outputs),
            endpoint_url=twin.endpoint_url,
            session=boto3.session.Session(
                aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
            ),
        )
        (handle,) = client.submit([request("e-lost", CORRECT, commands=[["sleep", "3"]])])
        deadline = time.monotonic() + 60
        # Its sandbox is running the job's command. (Not any descendant: the sandbox runtime
        # may fork ahead, and a kill before the job was taken is no lost job.)
        while not any(cmdline(pid) == ["sleep", "3"] for pid in descendants(doomed)):
            assert time.monotonic() < deadline, "the worker never took the job"
            time.sleep(0.05)
        sandboxes = descendants(doomed)
        assert twin.pool.kill() == [doomed]
        result = handle.result(timeout=120)
        assert result.reward == 1.0
        (replacement,) = twin.pool.pids()
        assert replacement != doomed and twin.pool.replaced == 1
        assert not {pid for pid in sandboxes if Path(f"/proc/{pid}").exists()}
        sfn = twin.client("stepfunctions")
        arn = twin.output(c.OUTPUT_ROLLOUT_ARN).replace(":stateMachine:", ":execution:")
        history = sfn.get_execution_history(executionArn=f"{arn}:e-lost")["events"]
        types = [e["type"] for e in history]
        # The result counts the Execute attempts: the lost one and the retry that answered.
        sends = [
            e
            for e in history
            if e["type"] == "TaskScheduled"
            and e["taskScheduledEventDetails"]["resourceType"] == "sqs"
        ]
        if "TaskTimedOut" in types:
            assert result.attempts == len(sends) == 2, (result.attempts, types)
        else:
            # Once in a loaded run, the lost job's message came back to the replacement while
            # its token still lived, and the replacement answered the first attempt: also one
            # correct result, the other way a lost job is recovered.
            assert result.attempts == len(sends) == 1, (result.attempts, types)
        client.close()
