"""The recorder handler's metrics, as the SandboxErrorRate alarm reads them (infra/monitoring.py):
`SandboxError` in namespace Trialbox with the `service` dimension the stack gives the function,
1 or 0 per result written, nothing for a result already recorded."""

from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from infra.lambdas import service_name
from tests.support.moto import Aws
from trialbox import constants as c

CONTEXT = SimpleNamespace(
    function_name="recorder",
    function_version="$LATEST",
    memory_limit_in_mb=512,
    invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:recorder",
    aws_request_id="req-1",
)


@pytest.fixture
def handler(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {
        c.ENV_TASKSETS_BUCKET: "tasksets",
        c.ENV_TRACES_BUCKET: "traces",
        c.ENV_EXECUTIONS_TABLE: "executions",
        c.ENV_ADMISSION_TABLE: aws.admission.table,
        "POWERTOOLS_SERVICE_NAME": service_name("recorder"),
        "POWERTOOLS_METRICS_NAMESPACE": c.METRICS_NAMESPACE,
        "POWERTOOLS_TRACE_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("functions.recorder.handler", None)  # it reads its settings at import
    return importlib.import_module("functions.recorder.handler").handler


def emitted(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if '"_aws"' in line]


def test_each_written_result_counts_as_a_sandbox_error_or_not(
    handler: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = {"request_id": "r-1", "error": {"Error": "States.HeartbeatTimeout"}}
    rejected = {"request_id": "r-2", "error": {"Error": c.ERROR_REJECTED, "Cause": "bad task"}}
    assert handler(lost, CONTEXT) == {"written": True}
    assert handler(rejected, CONTEXT) == {"written": True}
    assert handler(lost, CONTEXT) == {"written": False}  # already recorded: not counted again
    blobs = emitted(capsys.readouterr().out)
    assert len(blobs) == 3
    for blob in blobs:
        (directive,) = blob["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "Trialbox"
        assert directive["Dimensions"] == [["service"]]
        assert blob["service"] == "trialbox-recorder"
    assert [b.get(c.METRIC_SANDBOX_ERROR) for b in blobs] == [[1.0], [0.0], None]
    assert [b.get("ResultsAlreadyRecorded") for b in blobs] == [None, None, [1.0]]
