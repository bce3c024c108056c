"""A run through a twin that throttles, or answers 5xx to, a tenth of the project's AWS calls
(trialbox.local.faults) ends as it does with no faults: every sample with the status and
reward it gets on a healthy platform, nothing lost, and no sandbox run twice."""

from __future__ import annotations

import collections
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.twin import twin_and_client
from trialbox.local import principals
from trialbox.local.requestlog import ENV_REQUEST_LOG
from trialbox.models import ExecutionRequest, ExecutionResult, Status

log = logging.getLogger(__name__)
pytestmark = pytest.mark.timeout(2400)  # the module's run: its fixture's time is the first test's

SAMPLES = 1_000
FAULTS = 0.1
# The smallest graded task: one test.
TASK: dict[str, Any] = {
    "task_id": "add-one-test",
    "prompt": "Write add(a, b) in solution.py",
    "workspace": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "tests/test_add.py": (
            "from solution import add\ndef test_one():\n    assert add(1, 2) == 3\n"
        )
    },
    "grading": {"command": ["python", "-m", "pytest", "-q", "tests"]},
    "limits": {"timeout_s": 10, "memory_mb": 256},
}
# Each sample is one of these: scored 1, scored 0, and rejected by Prepare (no sandbox).
KINDS: dict[str, dict[str, Any]] = {
    "right": {"task": TASK, "files": {"solution.py": "def add(a, b):\n    return a + b\n"}},
    "wrong": {"task": TASK, "files": {"solution.py": "def add(a, b):\n    return 0\n"}},
    "rejected": {"task_ref": "missing@1/task", "files": {"solution.py": ""}},
}
JOB_OBJECT = re.compile(r"/jobs/([^/]+)/(job|report)\.json$")


def sample(kind: str, request_id: str) -> ExecutionRequest:
    return ExecutionRequest.model_validate(KINDS[kind] | {"request_id": request_id})


def kind_of(index: int) -> str:
    return ("right", "wrong", "right", "rejected")[index % 4]


def outcome(result: ExecutionResult) -> tuple[Status, float | None]:
    return result.status, result.reward


@dataclass
class FaultedRun:
    expected: dict[str, tuple[Status, float | None]]  # by kind, with no faults
    results: dict[str, ExecutionResult]  # by request id
    requests: list[dict[str, Any]]  # the faulted twin's request log
    wall_s: float


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultedRun]:
    with twin_and_client(workers=2) as (_, healthy):
        baseline = healthy.run([sample(k, f"healthy-{k}") for k in KINDS], timeout=120)
    expected = {k: outcome(r) for k, r in zip(KINDS, baseline, strict=True)}
    requests_log = tmp_path_factory.mktemp("faults") / "requests.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_REQUEST_LOG, str(requests_log))
        with twin_and_client(workers=16, faults=FAULTS, faults_seed=23) as (_, client):
            start = time.monotonic()
            samples = [sample(kind_of(i), f"faulted-{i}") for i in range(SAMPLES)]
            results = client.gather(client.submit(samples), timeout=SAMPLES * 2)
            wall_s = time.monotonic() - start
    log.warning("%d samples at %.0f %% faults: %.0f s", SAMPLES, FAULTS * 100, wall_s)
    entries = [json.loads(line) for line in requests_log.read_text().splitlines()]
    by_id = {s.request_id: r for s, r in zip(samples, results, strict=True)}
    yield FaultedRun(expected, by_id, entries, wall_s)


def test_the_baseline_is_what_the_reward_table_says(faulted_run: FaultedRun) -> None:
    assert faulted_run.expected == {
        "right": (Status.SUCCEEDED, 1.0),
        "wrong": (Status.SUCCEEDED, 0.0),
        "rejected": (Status.REJECTED, None),
    }


def test_faults_were_injected_into_a_tenth_of_the_projects_calls(faulted_run: FaultedRun) -> None:
    ours = [
        e
        for e in faulted_run.requests
        if e["key"] in (principals.SDK, principals.WORKER)
        or e["key"].startswith(principals.FUNCTION_PREFIX)
    ]
    server_errors = sum(answered(e) >= 500 for e in ours)
    # Half the faults are 5xx (S3's SlowDown is a 503 too); the pipeline answers none itself.
    assert 0.03 < server_errors / len(ours) < 0.09
    theirs = [e for e in faulted_run.requests if e["key"] == principals.STATE_MACHINES]
    assert theirs and not [e for e in theirs if answered(e) >= 500]


def answered(entry: dict[str, Any]) -> int:
    """A logged request's status: none when moto raised, and werkzeug answered it 500."""
    status = entry["status"]
    return 500 if status is None else int(status)


def test_every_sample_ends_as_it_does_with_no_faults(faulted_run: FaultedRun) -> None:
    results = faulted_run.results
    assert len(results) == SAMPLES  # nothing lost: every request has its one result
    differ = {
        rid: (outcome(r), r.error)
        for rid, r in results.items()
        if outcome(r) != faulted_run.expected[kind_of(int(rid.rsplit("-", 1)[1]))]
    }
    assert len(differ) <= SAMPLES // 1000, differ  # at least 99.9 %


def test_no_sandbox_runs_twice(faulted_run: FaultedRun) -> None:
    """Sandbox runs counted from the worker's own S3 calls: each run reads its job.json
    first and uploads its report.json last (not from the table, whose conditional put would
    hide a second run)."""
    runs: collections.Counter[str] = collections.Counter()
    reports: collections.Counter[str] = collections.Counter()
    for e in faulted_run.requests:
        found = JOB_OBJECT.search(e["path"])
        if e["key"] != principals.WORKER or e["status"] != 200 or found is None:
            continue
        if found.group(2) == "job" and e["method"] == "GET":
            runs[found.group(1)] += 1
        elif found.group(2) == "report" and e["method"] == "PUT":
            reports[found.group(1)] += 1
    sandboxed = {f"faulted-{i}" for i in range(SAMPLES) if kind_of(i) != "rejected"}
    assert set(runs) == set(reports) == sandboxed
    assert [rid for rid, n in runs.items() if n > 1] == []
    assert [rid for rid, n in reports.items() if n > 1] == []
