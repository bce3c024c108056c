"""The pool's HeldSessions metric: each worker writes, once a minute, how many sessions it
hosts as a CloudWatch embedded-metric-format line on its log stream (the awslogs driver
carries it; CloudWatch extracts the metric: no API call, no IAM grant, no VPC endpoint). The
pool's scale-in rule counts it: a pool never shrinks while a session is held.

Written here rather than with Powertools' Metrics: the worker image carries trialbox's core
dependencies only, and this is one line of JSON."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from trialbox import constants as c

EVERY_S = 60.0


def held_sessions_line(pool: str, held: int, now: float | None = None) -> str:
    metric = {"Name": c.METRIC_HELD_SESSIONS, "Unit": "Count"}
    directive = {
        "Namespace": c.METRICS_NAMESPACE,
        "Dimensions": [[c.DIMENSION_POOL]],
        "Metrics": [metric],
    }
    timestamp = int((time.time() if now is None else now) * 1000)
    document = {
        "_aws": {"Timestamp": timestamp, "CloudWatchMetrics": [directive]},
        c.DIMENSION_POOL: pool,
        c.METRIC_HELD_SESSIONS: held,
    }
    return json.dumps(document)


def report_held_sessions(
    pool: str, held: Callable[[], int], stop: threading.Event, out: TextIO = sys.stdout
) -> threading.Thread:
    """A daemon thread writing the line every EVERY_S until `stop`."""

    def run() -> None:
        while True:
            out.write(held_sessions_line(pool, held()) + "\n")
            out.flush()
            if stop.wait(EVERY_S):
                return

    thread = threading.Thread(target=run, daemon=True, name="held-sessions")
    thread.start()
    return thread
