"""A batch's Settle under moto: after its Run failed, every sample without a result gets one
`sandbox_error` naming the error; a sample with its result keeps it, and its trace."""

from __future__ import annotations

import json

from tests.support.moto import Aws
from trialbox.models import Status
from trialbox.models.batches import BatchInput
from trialbox.models.jobs import StepError
from trialbox.pipeline.recorder import Recorder, RecordInput
from trialbox.pipeline.settle import Settler


def test_only_the_samples_without_a_result_get_one(aws: Aws) -> None:
    recorder = Recorder(aws.table, aws.traces, aws.admission)
    finished = StepError(Error="Sandbox.Error", Cause="the first result")
    assert recorder(RecordInput(request_id="s-done", error=finished)).written
    trace = aws.traces.get_bytes("s3://traces/traces/s-done.json")
    batch = BatchInput(
        batch_id="b-1",
        requests_uri="s3://traces/batches/b-1.json",
        request_ids=["s-done", "s-1", "s-2"],
    )
    timed_out = StepError(Error="States.Timeout", Cause="the batch ran past its bound")
    assert Settler(recorder)(batch, timed_out) == ["s-1", "s-2"]
    assert Settler(recorder)(batch, timed_out) == []
    for rid in ("s-1", "s-2"):
        result = json.loads(aws.item(rid)["result"]["S"])  # type: ignore[index]
        assert (result["status"], result["loss_mask"]) == (Status.SANDBOX_ERROR.value, True)
        assert result["error"].startswith("States.Timeout")
    assert aws.traces.get_bytes("s3://traces/traces/s-done.json") == trace
