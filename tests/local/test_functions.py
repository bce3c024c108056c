"""The twin's Lambda host behaves as Lambda does when a handler hangs or its process dies."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trialbox.local.functions import FunctionHost
from trialbox.local.resources import FunctionSpec

HANDLER = """
import os, time

time.sleep(1.5)  # a slow init: not part of any invocation's timeout, as in Lambda

def handler(event, context):
    if event.get("exit") is not None:
        os._exit(event["exit"])
    time.sleep(event.get("sleep", 0))
    return {"pid": os.getpid(), "left_ms": context.get_remaining_time_in_millis()}
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FunctionHost]:
    (tmp_path / "flaky_handler.py").write_text(HANDLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = FunctionSpec("Flaky", "flaky_handler.handler", {}, timeout_s=1.0)
    functions = FunctionHost({"Flaky": spec}, {}, tmp_path / "logs", copies=1)
    functions.start()
    yield functions
    functions.stop()


def call(host: FunctionHost, event: dict[str, object]) -> tuple[bool, dict[str, object]]:
    ok, body = host.invoke("Flaky", json.dumps(event).encode())
    return ok, json.loads(body)


def test_an_overrun_is_a_timeout_error_and_the_next_call_gets_a_fresh_process(
    host: FunctionHost,
) -> None:
    ok, first = call(host, {})
    assert ok and 0 < int(str(first["left_ms"])) <= 1000
    started = time.monotonic()
    ok, error = call(host, {"sleep": 30})
    assert time.monotonic() - started < 10
    assert not ok
    assert error["errorType"] == "Sandbox.Timedout"
    assert error["errorMessage"] == "Task timed out after 1.00 seconds"
    ok, after = call(host, {})
    assert ok and after["pid"] != first["pid"]


def test_a_process_that_dies_is_reported_and_replaced(host: FunctionHost) -> None:
    ok, error = call(host, {"exit": 3})
    assert not ok
    assert error == {
        "errorType": "Runtime.ExitError",
        "errorMessage": "Flaky exited with 3 before answering",
        "stackTrace": [],
    }
    ok, after = call(host, {})
    assert ok and "pid" in after


def test_a_process_that_died_while_idle_is_replaced_before_the_next_call(
    host: FunctionHost,
) -> None:
    (idle,) = host.idle["Flaky"].queue
    idle.kill()
    idle.wait()
    ok, after = call(host, {})
    assert ok and after["pid"] != idle.pid
