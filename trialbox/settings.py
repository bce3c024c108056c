"""Each process's settings, read from its environment by one reader, with every default here.

The stack passes its values through the same names (`trialbox.constants.ENV_*`), and its own
defaults (`infra/config.py`) are these constants: nothing disagrees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trialbox import constants as c
from trialbox.errors import TrialboxError

# Step Functions starts the heartbeat clock when the job is queued, not when a worker takes it.
# Admission (trialbox.pipeline.admission) queues a job only for a live slot, so the heartbeat
# covers a job's time between two heartbeats, not a backlog.
HEARTBEAT_S = 300
EXECUTE_MARGIN_S = 120  # the Execute step's timeout beyond the runner's own deadline
RESULT_TTL_DAYS = 30
RECYCLE_AFTER_JOBS = 100  # jobs a pool worker runs before it exits for a fresh task
STOP_TIMEOUT_S = 120  # Fargate's most: SIGTERM, then SIGKILL after this
STOP_GRACE_S = STOP_TIMEOUT_S - 30  # a running job is handed back with time left to answer
# A work-queue message stays invisible this many heartbeats; the worker extends it on each.
WORK_VISIBILITY_HEARTBEATS = 3
# Jobs a pool task runs at once: its lease offers one slot (trialbox.worker.loop.free_slots),
# and the scaler sizes the pool by it.
TASK_SLOTS = 1
# The pool's scaler (trialbox.pipeline.scaler): in to the warm minimum after this long idle
# ("scale in to the warm minimum within about 5 minutes of idle", issue 24), deciding every
# SCALER_TICK_S for SCALER_RUN_S an invocation (EventBridge runs it at most once a minute).
SCALE_IN_IDLE_S = 300.0
SCALER_TICK_S = 10.0
SCALER_RUN_S = 50.0


def work_visibility_s(heartbeat_s: int) -> int:
    """The work queue's visibility timeout, set by the stack and extended by the worker."""
    return heartbeat_s * WORK_VISIBILITY_HEARTBEATS


# The only variables read that are not TRIALBOX_*: ECS sets them in a task's container.
ECS_METADATA_URI = "ECS_CONTAINER_METADATA_URI_V4"
ECS_AGENT_URI = "ECS_AGENT_URI"


class EnvSettings(BaseModel):
    """A process's settings: fields named by their environment variables (aliases); unset or
    empty variables take the defaults. A bad value is an error naming the variable."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        source = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            alias = field.alias or name
            if source.get(alias):
                values[alias] = source[alias]
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise TrialboxError(f"invalid environment for {cls.__name__}: {problems}") from None

    def required(self, name: str) -> str:
        value = getattr(self, name)
        if not value:
            alias = type(self).model_fields[name].alias or name
            raise TrialboxError(f"{alias} is not set for this process")
        return str(value)


class FunctionSettings(EnvSettings):
    """The Lambda functions' (each reads the fields it uses)."""

    tasksets_bucket: str = Field(alias=c.ENV_TASKSETS_BUCKET)
    traces_bucket: str = Field(alias=c.ENV_TRACES_BUCKET)
    executions_table: str | None = Field(default=None, alias=c.ENV_EXECUTIONS_TABLE)
    result_ttl_days: int = Field(default=RESULT_TTL_DAYS, ge=1, alias=c.ENV_RESULT_TTL_DAYS)
    rollout_arn: str | None = Field(default=None, alias=c.ENV_ROLLOUT_ARN)
    batch_arn: str | None = Field(default=None, alias=c.ENV_BATCH_ARN)
    work_queue_url: str | None = Field(default=None, alias=c.ENV_WORK_QUEUE_URL)
    open_queue_url: str | None = Field(default=None, alias=c.ENV_OPEN_QUEUE_URL)  # the scaler's
    requests_dlq_url: str | None = Field(default=None, alias=c.ENV_REQUESTS_DLQ_URL)
    requests_queue_url: str | None = Field(default=None, alias=c.ENV_REQUESTS_QUEUE_URL)
    admission_table: str | None = Field(default=None, alias=c.ENV_ADMISSION_TABLE)
    heartbeat_s: int = Field(default=HEARTBEAT_S, ge=5, alias=c.ENV_HEARTBEAT_S)
    execute_margin_s: int = Field(default=EXECUTE_MARGIN_S, ge=1, alias=c.ENV_EXECUTE_MARGIN_S)
    session_queue_prefix: str | None = Field(default=None, alias=c.ENV_SESSION_QUEUE_PREFIX)
    # The scaler's: the pool's service, its bounds, and how often it decides.
    cluster: str | None = Field(default=None, alias=c.ENV_CLUSTER)
    pool_service: str | None = Field(default=None, alias=c.ENV_POOL_SERVICE)
    pool_name: str | None = Field(default=None, alias=c.ENV_POOL_NAME)  # HeldSessions' Pool
    pool_min_tasks: int = Field(default=0, ge=0, alias=c.ENV_POOL_MIN_TASKS)
    pool_max_tasks: int = Field(default=1, ge=1, alias=c.ENV_POOL_MAX_TASKS)
    pool_slots_per_task: int = Field(default=TASK_SLOTS, ge=1, alias=c.ENV_POOL_SLOTS_PER_TASK)
    scale_in_idle_s: float = Field(default=SCALE_IN_IDLE_S, ge=0, alias=c.ENV_SCALE_IN_IDLE_S)
    scaler_tick_s: float = Field(default=SCALER_TICK_S, gt=0, alias=c.ENV_SCALER_TICK_S)
    scaler_run_s: float = Field(default=SCALER_RUN_S, ge=0, alias=c.ENV_SCALER_RUN_S)


class WorkerSettings(EnvSettings):
    """The pool worker's (`python -m trialbox.worker`)."""

    traces_bucket: str = Field(alias=c.ENV_TRACES_BUCKET)
    work_queue_url: str = Field(alias=c.ENV_WORK_QUEUE_URL)
    finish_queue_url: str = Field(alias=c.ENV_FINISH_QUEUE_URL)  # a batched sample's end
    heartbeat_s: int = Field(default=HEARTBEAT_S, ge=5, alias=c.ENV_HEARTBEAT_S)
    recycle_after_jobs: int = Field(
        default=RECYCLE_AFTER_JOBS, ge=1, alias=c.ENV_RECYCLE_AFTER_JOBS
    )
    stop_grace_s: float = Field(default=STOP_GRACE_S, gt=0, alias=c.ENV_STOP_GRACE_S)
    name: str | None = Field(default=None, alias=c.ENV_WORKER_NAME)  # the host name if unset
    admission_table: str = Field(alias=c.ENV_ADMISSION_TABLE)  # its lease: the pool's slots
    # Its inbox for the sessions it hosts is named with it (the IAM grant names the prefix).
    session_queue_prefix: str = Field(alias=c.ENV_SESSION_QUEUE_PREFIX)
    open_queue_url: str = Field(alias=c.ENV_OPEN_QUEUE_URL)  # the sessions it has room for
    # The pool's name in its metrics (HeldSessions); unset (the twin): no metrics.
    pool_name: str | None = Field(default=None, alias=c.ENV_POOL_NAME)
    # Set by ECS in the container; unset outside ECS (the twin): the task metadata endpoint
    # (its task's ARN names it) and the agent's (task protection while it hosts a session).
    ecs_metadata_uri: str | None = Field(default=None, alias=ECS_METADATA_URI)
    ecs_agent_uri: str | None = Field(default=None, alias=ECS_AGENT_URI)


class ClientSettings(EnvSettings):
    """The SDK's, when no stack name is given: where the deployment's resources are."""

    endpoint_url: str | None = Field(default=None, alias=c.ENV_ENDPOINT_URL)
    stack: str | None = Field(default=None, alias=c.ENV_STACK)  # instead of the names below
    requests_queue_url: str | None = Field(default=None, alias=c.ENV_REQUESTS_QUEUE_URL)
    executions_table: str | None = Field(default=None, alias=c.ENV_EXECUTIONS_TABLE)
    traces_bucket: str | None = Field(default=None, alias=c.ENV_TRACES_BUCKET)
    tasksets_bucket: str | None = Field(default=None, alias=c.ENV_TASKSETS_BUCKET)
    rollout_arn: str | None = Field(default=None, alias=c.ENV_ROLLOUT_ARN)  # for cancel
    admission_table: str | None = Field(default=None, alias=c.ENV_ADMISSION_TABLE)  # for cancel
    pool_capacity: int | None = Field(default=None, ge=1, alias=c.ENV_POOL_CAPACITY)
    open_queue_url: str | None = Field(default=None, alias=c.ENV_OPEN_QUEUE_URL)  # sessions
    session_queue_prefix: str | None = Field(default=None, alias=c.ENV_SESSION_QUEUE_PREFIX)
    cluster: str | None = Field(default=None, alias=c.ENV_CLUSTER)  # a lost worker's fate
    result_ttl_days: int = Field(default=RESULT_TTL_DAYS, ge=1, alias=c.ENV_RESULT_TTL_DAYS)
