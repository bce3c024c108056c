"""ECS task scale-in protection while a worker hosts sessions: service auto scaling and
deployments never stop a task that holds a session's workspace. Set through the ECS agent's
endpoint in the container (`$ECS_AGENT_URI/task-protection/v1/state`); outside ECS (the twin)
there is no agent and nothing to protect."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.request

log = logging.getLogger("trialbox.worker")

MAX_MINUTES = 2880  # ECS's most
MARGIN_MINUTES = 2  # past the last TTL: a session ending at its TTL is never cut short


class TaskProtection:
    """Protected while any session is held, until the latest TTL; unprotected when none is."""

    def __init__(self, agent_uri: str | None) -> None:
        self.url = f"{agent_uri.rstrip('/')}/task-protection/v1/state" if agent_uri else None
        self._until: float | None = None  # epoch s the protection set lasts to (None: off)
        self._lock = threading.Lock()

    def update(self, held: int, latest_expiry: float | None) -> None:
        """After a session opened or ended: `held` sessions, the last ending at
        `latest_expiry` (epoch s)."""
        if self.url is None:
            return
        with self._lock:
            if held and latest_expiry is not None:
                if self._until is not None and self._until >= latest_expiry:
                    return  # already protected long enough
                minutes = math.ceil((latest_expiry - time.time()) / 60) + MARGIN_MINUTES
                minutes = max(1, min(MAX_MINUTES, minutes))
                if self._put({"ProtectionEnabled": True, "ExpiresInMinutes": minutes}):
                    self._until = time.time() + minutes * 60
            elif not held and self._until is not None and self._put({"ProtectionEnabled": False}):
                self._until = None

    def _put(self, state: dict[str, object]) -> bool:
        assert self.url is not None
        request = urllib.request.Request(
            self.url,
            data=json.dumps(state).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                answer.read()
            return True
        except OSError as exc:  # never fatal: a scale-in could then stop a session's task,
            log.error("task scale-in protection %s failed: %s", state, exc)  # which fails over
            return False
