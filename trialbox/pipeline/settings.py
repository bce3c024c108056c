"""Each function's environment, read once into a model (names in `trialbox.constants`)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from pydantic import BaseModel, Field

from trialbox import constants as c


class FunctionSettings(BaseModel):
    tasksets_bucket: str = Field(alias=c.ENV_TASKSETS_BUCKET)
    traces_bucket: str = Field(alias=c.ENV_TRACES_BUCKET)
    executions_table: str | None = Field(default=None, alias=c.ENV_EXECUTIONS_TABLE)
    result_ttl_days: int = Field(default=30, alias=c.ENV_RESULT_TTL_DAYS)
    rollout_arn: str | None = Field(default=None, alias=c.ENV_ROLLOUT_ARN)
    requests_dlq_url: str | None = Field(default=None, alias=c.ENV_REQUESTS_DLQ_URL)
    heartbeat_s: int = Field(default=60, alias=c.ENV_HEARTBEAT_S)
    execute_margin_s: int = Field(default=120, alias=c.ENV_EXECUTE_MARGIN_S)

    @classmethod
    def from_env(cls) -> FunctionSettings:
        return cls.model_validate(dict(os.environ))

    def required(self, name: str) -> str:
        value = getattr(self, name)
        if not value:
            raise RuntimeError(f"{name} is not configured for this function")
        return str(value)


def client(service: str) -> Any:
    """A boto3 client; AWS_ENDPOINT_URL(_<SERVICE>) points it at the local twin when set."""
    return boto3.client(service)
