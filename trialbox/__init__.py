"""Trialbox: sandbox infrastructure for agent reinforcement learning on code.

    from trialbox import Client, ExecutionRequest

The public names below load on first use, so that the Lambda functions and the worker, which
import `trialbox.*` modules, never load the SDK. Exceptions live in `trialbox.errors`, data
contracts in `trialbox.models`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__: str  # read on first use (__getattr__)

_PUBLIC = {
    "AsyncClient": "trialbox.sdk",
    "AsyncHandle": "trialbox.sdk",
    "Client": "trialbox.sdk",
    "Handle": "trialbox.sdk",
    "Session": "trialbox.sdk",
    "AsyncSession": "trialbox.sdk",
    "Resources": "trialbox.sdk",
    "TaskSetRef": "trialbox.sdk",
    "ExecutionRequest": "trialbox.models",
    "ExecutionResult": "trialbox.models",
    "Limits": "trialbox.models",
    "Status": "trialbox.models",
    "Task": "trialbox.models",
    "AwsCallError": "trialbox.errors",
    "ClientClosed": "trialbox.errors",
    "InputError": "trialbox.errors",
    "MissingExtra": "trialbox.errors",
    "MissingResources": "trialbox.errors",
    "RequestIdReused": "trialbox.errors",
    "SessionError": "trialbox.errors",
    "TrialboxError": "trialbox.errors",
    "WaitTimeout": "trialbox.errors",
}

if TYPE_CHECKING:
    from trialbox.errors import (
        AwsCallError,
        ClientClosed,
        InputError,
        MissingExtra,
        MissingResources,
        RequestIdReused,
        SessionError,
        TrialboxError,
        WaitTimeout,
    )
    from trialbox.models import ExecutionRequest, ExecutionResult, Limits, Status, Task
    from trialbox.sdk import (
        AsyncClient,
        AsyncHandle,
        AsyncSession,
        Client,
        Handle,
        Resources,
        Session,
        TaskSetRef,
    )


def __getattr__(name: str) -> Any:
    if name == "__version__":  # on first use: importlib.metadata is a tenth of a child's start
        return _version()
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'trialbox' has no attribute {name!r}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trialbox")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0+source"


__all__ = [  # noqa: RUF022 (the groups above)
    "AsyncClient",
    "AsyncHandle",
    "Client",
    "Handle",
    "Session",
    "AsyncSession",
    "Resources",
    "TaskSetRef",
    "ExecutionRequest",
    "ExecutionResult",
    "Limits",
    "Status",
    "Task",
    "AwsCallError",
    "ClientClosed",
    "InputError",
    "MissingExtra",
    "MissingResources",
    "RequestIdReused",
    "SessionError",
    "TrialboxError",
    "WaitTimeout",
    "__version__",
]
