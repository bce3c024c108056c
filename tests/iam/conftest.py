"""One recorded twin run per module (tests/iam/recording.py drives it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.iam.recording import HARNESS, HEARTBEAT_S, Recorded, drive, start_worker, tokens
from trialbox.local.requestlog import ENV_REQUEST_LOG
from trialbox.local.services import client as twin_client
from trialbox.local.template import load_template
from trialbox.local.twin import LocalTwin


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    tmp = tmp_path_factory.mktemp("iam")
    log = tmp / "requests.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_REQUEST_LOG, str(log))
        # The scaler on the twin's time scale: it reads, turns idle, sees work and sets the
        # service's count within the run (every one of its grants used).
        with LocalTwin(
            workers=0, heartbeat_s=HEARTBEAT_S, scaler_tick_s=0.5, scale_in_idle_s=2
        ) as twin:
            workers = [start_worker(twin, f"iam-{n}") for n in range(2)]
            results, cli_exit, cli_traces = drive(twin, tmp, workers)
            for worker in workers:
                worker.stop.set()
            entries = [json.loads(line) for line in log.read_text().splitlines()]
            sfn = twin_client(twin.endpoint_url, "stepfunctions", HARNESS)
            answered = tokens(sfn, entries)
    yield Recorded(load_template(), entries, answered, results, cli_exit, cli_traces)
