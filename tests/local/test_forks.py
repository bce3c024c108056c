"""The twin's function processes are forked from a warm zygote (trialbox.local.forks), and are
still what Lambda gives each function: a process of its own, with the function's own
environment and nothing of its caller's, that does not outlive its host."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import alive
from trialbox.local.forks import PRELOAD
from trialbox.local.functions import FunctionHost
from trialbox.local.resources import FunctionSpec
from trialbox.local.template import load_template

HANDLER = """
import os, time

SEEN = {name: os.environ.get(name) for name in ("WHO", "TRIALBOX_CALLER_ONLY")}

def handler(event, context):
    time.sleep(event.get("sleep", 0))
    return {"pid": os.getpid(), "seen": SEEN}
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FunctionHost]:
    (tmp_path / "who_handler.py").write_text(HANDLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRIALBOX_CALLER_ONLY", "the caller's")
    specs = {
        name: FunctionSpec(name, "who_handler.handler", {"WHO": name}, timeout_s=60.0)
        for name in ("First", "Second")
    }
    functions = FunctionHost(specs, {"SHARED": "1"}, tmp_path / "logs", copies=1)
    functions.start()
    yield functions
    functions.stop()


def call(host: FunctionHost, name: str, **event: object) -> dict[str, object]:
    ok, body = host.invoke(name, json.dumps(event).encode())
    assert ok, body
    return dict(json.loads(body))


def test_each_function_imports_its_handler_with_its_own_environment(host: FunctionHost) -> None:
    first, second = call(host, "First"), call(host, "Second")
    assert first["seen"] == {"WHO": "First", "TRIALBOX_CALLER_ONLY": None}
    assert second["seen"] == {"WHO": "Second", "TRIALBOX_CALLER_ONLY": None}
    assert first["pid"] != second["pid"]


def test_a_function_process_mid_invocation_goes_with_its_host(host: FunctionHost) -> None:
    """Its invocation ends too, as an error, rather than waiting for an exit nobody reports."""
    pid = int(str(call(host, "First")["pid"]))
    ended: list[BaseException | tuple[bool, bytes]] = []

    def invoke() -> None:
        try:
            ended.append(host.invoke("First", b'{"sleep": 120}'))
        except BaseException as exc:
            ended.append(exc)

    invoking = threading.Thread(target=invoke, daemon=True)
    invoking.start()
    time.sleep(0.5)
    assert alive(pid)
    host.stop()
    invoking.join(timeout=10)
    assert not invoking.is_alive() and len(ended) == 1, ended
    deadline = time.monotonic() + 10  # SIGKILLed, it may take a moment to be gone
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_a_zygote_that_died_is_replaced_and_its_processes_count_as_killed(
    host: FunctionHost,
) -> None:
    """The zygote SIGKILLed: nothing reports its children's exits any more, so they are
    killed, and the next invocation forks from a new zygote instead of waiting forever."""
    assert host.zygote is not None
    first, dead = int(str(call(host, "First")["pid"])), host.zygote
    dead._process.kill()
    deadline = time.monotonic() + 10
    while not dead.gone:  # the host reads the zygote's end of the socket close
        assert time.monotonic() < deadline
        time.sleep(0.05)
    answered: list[dict[str, object]] = []
    again = threading.Thread(target=lambda: answered.append(call(host, "First")), daemon=True)
    again.start()
    again.join(timeout=30)
    assert answered and answered[0]["pid"] != first, answered
    assert dead.gone and not alive(first) and host.zygote is not dead


def test_a_large_environment_reaches_its_function_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork request of 100 KB (the environment): one datagram, not a cut-off stream."""
    (tmp_path / "who_handler.py").write_text(HANDLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    big = "x" * 100_000
    spec = FunctionSpec("Big", "who_handler.handler", {"WHO": big}, timeout_s=60.0)
    functions = FunctionHost({"Big": spec}, {}, tmp_path / "logs", copies=1)
    functions.start()
    try:
        assert call(functions, "Big")["seen"] == {"WHO": big, "TRIALBOX_CALLER_ONLY": None}
    finally:
        functions.stop()


READS = """
import importlib, json, os, sys
read = set()
get, has = os._Environ.__getitem__, os._Environ.__contains__
os._Environ.__getitem__ = lambda self, key: read.add(key) or get(self, key)
os._Environ.__contains__ = lambda self, key: read.add(key) or has(self, key)
for module in sys.argv[1:]:
    importlib.import_module(module)
from trialbox.local import forks  # then what the zygote parses before it forks
forks.models_cache.share(forks.MODELS)
print(json.dumps(sorted(read)))
"""


def test_what_the_zygote_imports_reads_no_setting_of_a_function_s_own() -> None:
    """The zygote imports PRELOAD once and parses the handlers' service models, with the
    variables every function sets alike (and nothing of its caller's): a setting read there
    at import is the zygote's, not the function's. Each one the template's functions set,
    they all set to the same value."""
    done = subprocess.run(
        [sys.executable, "-c", READS, *PRELOAD], capture_output=True, text=True, check=True
    )
    read = set(json.loads(done.stdout))
    assert read  # the recording works: Python's own start-up reads some
    functions = [
        resource["Properties"].get("Environment", {}).get("Variables", {})
        for resource in load_template()["Resources"].values()
        if resource["Type"] == "AWS::Lambda::Function"
        and resource["Properties"]["Handler"].startswith("functions.")  # the twin's
    ]
    assert all("POWERTOOLS_SERVICE_NAME" in variables for variables in functions)
    values = {name: {json.dumps(v.get(name)) for v in functions} for name in read}
    assert not {name: seen for name, seen in values.items() if len(seen) > 1}
