"""A worker that takes a job and dies: the heartbeat lapses, Execute is retried, and a fresh
worker produces the correct result."""

from __future__ import annotations

import time

from tests.e2e.conftest import request
from tests.sandbox.conftest import CORRECT
from trialbox import constants as c
from trialbox.local.twin import LocalTwin
from trialbox.sdk import Client, Resources


def test_a_worker_killed_mid_job_gives_a_retry_and_a_correct_result() -> None:
    with LocalTwin(workers=0, heartbeat_s=5) as twin:  # the functions' least
        client = Client(
            Resources.from_outputs(twin.outputs),
            endpoint_url=twin.endpoint_url,
            session=__import__("boto3").session.Session(
                aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
            ),
        )
        (handle,) = client.submit([request("e-lost", CORRECT)])
        sqs = twin.client("sqs")
        deadline = time.monotonic() + 30
        taken: list = []
        while not taken:  # the doomed worker takes the job, then never beats or answers
            assert time.monotonic() < deadline, "no work arrived"
            taken = sqs.receive_message(
                QueueUrl=twin.output(c.OUTPUT_WORK_QUEUE_URL), WaitTimeSeconds=1
            ).get("Messages", [])
        twin.add_worker()
        result = handle.result(timeout=120)
        assert result.reward == 1.0
        sfn = twin.client("stepfunctions")
        arn = twin.output(c.OUTPUT_ROLLOUT_ARN).replace(":stateMachine:", ":execution:")
        history = sfn.get_execution_history(executionArn=f"{arn}:e-lost")["events"]
        kinds = [e["type"] for e in history]
        assert "TaskTimedOut" in kinds
        assert kinds.count("TaskSubmitted") == 2 or kinds.count("TaskScheduled") >= 2
        # The result counts the Execute attempts: the lost one and the retry that answered.
        sends = [
            e
            for e in history
            if e["type"] == "TaskScheduled"
            and e["taskScheduledEventDetails"]["resourceType"] == "sqs"
        ]
        assert result.attempts == len(sends) == 2
