"""Even when Record itself fails, the request ends with exactly one terminal result."""

from __future__ import annotations

from tests.support.tasks import CORRECT
from tests.support.twin import request
from trialbox.models import Status
from trialbox.sdk import Client

RECORD_FAILED = "the result could not be recorded (Record failed; see the execution's history)"


def test_a_failing_record_still_leaves_one_sandbox_error_result() -> None:
    with Client.local(workers=1) as client:
        s3, bucket = client.aio._aws.s3, client.aio.resources.traces_bucket
        # Without the bucket Prepare fails, and so does Record on every retry: it writes the
        # trace first.
        for found in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=found["Key"])
        s3.delete_bucket(Bucket=bucket)
        (result,) = client.run([request("e-norecord", CORRECT)], timeout=120)
        assert (result.status, result.reward, result.loss_mask) == (
            Status.SANDBOX_ERROR,
            None,
            True,
        )
        assert result.error == RECORD_FAILED
        assert result.feedback == f"sandbox error (not your code): {RECORD_FAILED}"
