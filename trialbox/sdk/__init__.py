"""The SDK: `Client` (blocking) and `AsyncClient` (asyncio), one implementation."""

from trialbox.sdk.core import AsyncClient, SessionOpening
from trialbox.sdk.handles import AsyncHandle
from trialbox.sdk.inputs import RequestInput, TaskInput
from trialbox.sdk.resources import Resources, default_concurrency
from trialbox.sdk.sessions import AsyncSession
from trialbox.sdk.sync import Client, Handle, Session
from trialbox.sdk.tasksets import TaskSetRef, request_id

__all__ = [
    "AsyncClient",
    "AsyncHandle",
    "AsyncSession",
    "Client",
    "Handle",
    "RequestInput",
    "Resources",
    "Session",
    "SessionOpening",
    "TaskInput",
    "TaskSetRef",
    "default_concurrency",
    "request_id",
]
