"""SDK -> SQS -> dispatcher -> Rollout (Prepare, Execute on a worker, Score, Record) -> SDK."""

from __future__ import annotations

import json

from tests.support.tasks import CORRECT
from tests.support.twin import request
from trialbox import constants as c
from trialbox import keys
from trialbox.metering import execution_transitions
from trialbox.models import Status
from trialbox.sdk import Client

WRONG = "def add(a, b):\n    return 3\n"


def test_correct_scores_one_and_wrong_scores_less(client: Client) -> None:
    good, bad = client.run([request("e-good", CORRECT), request("e-bad", WRONG)], timeout=120)
    assert (good.status, good.reward, good.loss_mask) == (Status.SUCCEEDED, 1.0, False)
    assert (bad.status, bad.reward) == (Status.SUCCEEDED, 0.5)
    assert "FAILED tests/test_add.py::test_negative" in bad.feedback
    assert good.trace_uri == "s3://storagetraces5d09ed83/traces/e-good.json"
    assert good.provenance is not None and good.provenance.backend == "bwrap"


def test_a_bad_request_is_rejected_with_its_reason(client: Client) -> None:
    bad = request("e-reject", CORRECT).model_copy(update={"task_ref": None})
    bad_body = json.loads(bad.model_dump_json()) | {"limits": {"memory_mb": 0}}
    twin = client.aio._twin
    assert twin is not None
    twin.client("sqs").send_message(
        QueueUrl=client.aio.resources.requests_queue_url, MessageBody=json.dumps(bad_body)
    )
    (result,) = client.gather(client.submit([bad]), timeout=60)  # the stored result is taken
    assert (result.status, result.reward, result.loss_mask) == (Status.REJECTED, None, True)
    assert result.error == "limits.memory_mb: Input should be greater than or equal to 32"


def test_a_task_ref_that_does_not_exist_is_rejected_by_prepare(client: Client) -> None:
    missing = request("e-noref", CORRECT).model_copy(update={"task": None, "task_ref": "x@1/y"})
    (result,) = client.run([missing], timeout=60)
    assert result.status == Status.REJECTED
    assert result.error == "task_ref: task set x@1 not found"


def test_a_duplicate_request_id_executes_once(client: Client) -> None:
    same = request("e-dup", CORRECT)
    first = client.submit([same])
    second = client.submit([same])
    assert first[0].result(timeout=120).reward == second[0].result(timeout=5).reward == 1.0
    twin = client.aio._twin
    assert twin is not None
    sfn = twin.client("stepfunctions")
    executions = sfn.list_executions(stateMachineArn=twin.output(c.OUTPUT_ROLLOUT_ARN))
    assert [e["name"] for e in executions["executions"]].count("e-dup") == 1


def test_a_sample_sent_alone_costs_three_billed_transitions(client: Client) -> None:
    """Prepare, Execute, Record (which scores the run): counted from its history as Step
    Functions bills it (trialbox.metering). Four, with a Score step of its own, was the
    figure the scale audit priced at $100 per million samples."""
    (result,) = client.run([request("e-alone", CORRECT)], timeout=120)
    assert result.status == Status.SUCCEEDED
    twin = client.aio._twin
    assert twin is not None
    arn = keys.execution_arn(twin.output(c.OUTPUT_ROLLOUT_ARN), "e-alone")
    assert execution_transitions(twin.client("stepfunctions"), arn) == 3


def test_fifty_concurrent_samples_all_reach_terminal_results(client: Client) -> None:
    requests = [request(f"e-many-{i}", CORRECT if i % 2 else WRONG) for i in range(50)]
    results = client.gather(client.submit(requests), timeout=600)
    assert len(results) == 50
    assert [r.reward for r in results] == [1.0 if i % 2 else 0.5 for i in range(50)]


def test_a_request_over_128_kib_travels_through_s3(client: Client) -> None:
    big = request("e-big", CORRECT + "# " + "x" * 200_000 + "\n")
    (result,) = client.run([big], timeout=120)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)
    twin = client.aio._twin
    assert twin is not None
    payload = twin.client("s3").get_object(  # keyed by content, not by request id
        Bucket=client.aio.resources.traces_bucket, Key=keys.payload_key(big.content_sha256())
    )
    assert len(payload["Body"].read()) > 200_000


def test_a_checkpoint_carries_a_workspace_to_a_later_request(client: Client) -> None:
    """Turn 1 leaves files and asks for a checkpoint; turn 2 starts from it (the task's files,
    then the checkpoint, then its own overlay) and is graded on what turn 1 left."""
    write = ["python", "-c", f"open('solution.py', 'w').write({CORRECT!r}); open('n', 'w')"]
    (first,) = client.run(
        [request("e-ckpt-1", WRONG, commands=[write], grade=False, checkpoint=True)], timeout=120
    )
    assert first.status == Status.SUCCEEDED and first.checkpoint is not None
    twin = client.aio._twin
    assert twin is not None
    stored = (
        twin.client("s3")
        .get_object(
            Bucket=twin.output(c.OUTPUT_TRACES_BUCKET), Key=keys.checkpoint_key(first.checkpoint)
        )["Body"]
        .read()
    )
    assert keys.sha256_hex(stored) == first.checkpoint
    second, overlaid = client.run(
        [
            request("e-ckpt-2", CORRECT, base_checkpoint=first.checkpoint)
            .model_copy(update={"files": {}}),
            request("e-ckpt-3", WRONG, base_checkpoint=first.checkpoint,
                    commands=[["test", "-e", "n"]]),
        ],
        timeout=120,
    )  # fmt: skip
    assert (second.status, second.reward, second.checkpoint) == (Status.SUCCEEDED, 1.0, None)
    assert overlaid.reward == 0.5  # the request's own files win over the checkpoint's
    assert overlaid.commands[0].exit_code == 0  # turn 1's other file is there


def test_a_base_checkpoint_that_does_not_exist_is_rejected_by_prepare(client: Client) -> None:
    (result,) = client.run([request("e-nockpt", CORRECT, base_checkpoint="0" * 64)], timeout=60)
    assert (result.status, result.loss_mask) == (Status.REJECTED, True)
    assert result.error is not None and result.error.startswith(
        f"base_checkpoint: no checkpoint {'0' * 64}"
    )
