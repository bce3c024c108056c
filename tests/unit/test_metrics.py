"""The HeldSessions line a worker writes: CloudWatch's embedded metric format, once a minute
until the worker stops (the stack's side is in tests/infra/test_stack.py)."""

from __future__ import annotations

import io
import json
import threading

from trialbox import constants as c
from trialbox.worker.metrics import held_sessions_line, report_held_sessions


def test_the_line_is_an_embedded_metric_of_the_pools_held_sessions() -> None:
    line = json.loads(held_sessions_line("Trialbox", 2, now=1_700_000_000.5))
    assert line == {
        "_aws": {
            "Timestamp": 1_700_000_000_500,
            "CloudWatchMetrics": [
                {
                    "Namespace": c.METRICS_NAMESPACE,
                    "Dimensions": [[c.DIMENSION_POOL]],
                    "Metrics": [{"Name": c.METRIC_HELD_SESSIONS, "Unit": "Count"}],
                }
            ],
        },
        c.DIMENSION_POOL: "Trialbox",
        c.METRIC_HELD_SESSIONS: 2,
    }


def test_the_reporter_writes_at_once_and_ends_with_the_worker() -> None:
    out, stop = io.StringIO(), threading.Event()
    held = iter([3, 0])
    thread = report_held_sessions("P", lambda: next(held), stop, out)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)[c.METRIC_HELD_SESSIONS] == 3
