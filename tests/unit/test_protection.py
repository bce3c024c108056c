"""Task scale-in protection through the ECS agent's endpoint, against a local stand-in that
records each PUT as the agent receives it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from trialbox.worker.protection import TaskProtection


class Agent(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, dict[str, object]]]] = []

    def do_PUT(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Agent.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def agent() -> Iterator[str]:
    Agent.received = []
    server = HTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/api/task-id"
    server.shutdown()


def test_a_task_is_protected_while_it_holds_sessions_and_released_after(agent: str) -> None:
    protection = TaskProtection(agent)
    now = time.time()
    protection.update(1, now + 1800)  # a 30 min session opens
    protection.update(2, now + 600)  # a shorter one: already covered, no call
    protection.update(2, now + 7200)  # a longer one: extended
    protection.update(1, now + 7200)  # one ended: still held
    protection.update(0, None)  # none held
    protection.update(0, None)  # nothing to undo
    path = "/api/task-id/task-protection/v1/state"
    assert Agent.received == [
        (path, {"ProtectionEnabled": True, "ExpiresInMinutes": 32}),
        (path, {"ProtectionEnabled": True, "ExpiresInMinutes": 122}),
        (path, {"ProtectionEnabled": False}),
    ]


def test_without_an_agent_nothing_is_called_and_a_failing_agent_is_not_fatal() -> None:
    TaskProtection(None).update(1, time.time() + 60)  # the twin: no ECS agent
    unreachable = TaskProtection("http://127.0.0.1:9/api/x")
    unreachable.update(1, time.time() + 60)  # logged, never raised
    assert unreachable._until is None  # tried again at the next change
