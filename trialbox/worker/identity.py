"""Who a worker is, in its session replies: on ECS its task's ARN, read from the task metadata
endpoint, so that a client that lost the worker can ask ECS why it stopped (was the task out
of memory?); otherwise TRIALBOX_WORKER_NAME (the twin sets its tasks' ARNs there) or the
host name."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request

log = logging.getLogger("trialbox.worker")


def worker_name(configured: str | None, metadata_uri: str | None) -> str:
    """`metadata_uri`: ECS's task metadata endpoint (WorkerSettings.ecs_metadata_uri)."""
    if configured:
        return configured
    uri = metadata_uri
    if uri:
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/task", timeout=5) as answer:
                return str(json.load(answer)["TaskARN"])
        except (OSError, ValueError, KeyError) as exc:  # named by host, its fate unknown
            log.error("the task metadata endpoint gave no task ARN: %s", exc)
    return socket.gethostname()
