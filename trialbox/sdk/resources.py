"""Where a deployment's resources are: from stack outputs, or from TRIALBOX_* settings."""

from __future__ import annotations

from dataclasses import dataclass

from trialbox import constants as c
from trialbox.errors import MissingResources, TrialboxError
from trialbox.settings import RESULT_TTL_DAYS, ClientSettings

PER_WORKER = 4  # requests in flight per known pool worker: enough to keep each one busy
# When the pool's size is unknown (resource names given by hand without
# TRIALBOX_POOL_CAPACITY): modest, because a job queued longer than the heartbeat is retried.
UNKNOWN_CAPACITY_CONCURRENCY = 32


def default_concurrency(capacity: int | None) -> int:
    """How many requests to keep in flight for a pool of `capacity` workers (None: unknown).
    A queue deeper than the pool drains within its heartbeat would look like lost sandboxes."""
    return PER_WORKER * capacity if capacity else UNKNOWN_CAPACITY_CONCURRENCY


@dataclass(frozen=True)
class Resources:
    requests_queue_url: str
    executions_table: str
    traces_bucket: str
    tasksets_bucket: str
    rollout_arn: str | None = None  # cancel stops the execution when known
    admission_table: str | None = None  # cancel flags a batched sample's claim when known
    capacity: int | None = None  # the pool's jobs at once, when the stack says
    open_queue_url: str | None = None  # sessions open there
    session_queue_prefix: str | None = None  # sessions' own queues are named with it
    cluster: str | None = None  # the pool's ECS cluster: why a session's worker stopped
    run_code_url: str | None = None  # SandboxFusion's /run_code: a function URL, IAM auth
    result_ttl_days: int = RESULT_TTL_DAYS  # the stack's: how long a cancel's result is kept

    @classmethod
    def from_outputs(cls, outputs: dict[str, str]) -> Resources:
        needed = [c.OUTPUT_REQUESTS_QUEUE_URL, c.OUTPUT_EXECUTIONS_TABLE]
        needed += [c.OUTPUT_TRACES_BUCKET, c.OUTPUT_TASKSETS_BUCKET]
        missing = [name for name in needed if name not in outputs]
        if missing:
            raise TrialboxError(
                f"not a Trialbox stack: its outputs lack {', '.join(missing)} "
                "(deploy this version's stack, or pass the resource names)"
            )
        capacity = outputs.get(c.OUTPUT_POOL_CAPACITY)
        ttl_days = outputs.get(c.OUTPUT_RESULT_TTL_DAYS, str(RESULT_TTL_DAYS))
        for name, value in (
            (c.OUTPUT_POOL_CAPACITY, capacity),
            (c.OUTPUT_RESULT_TTL_DAYS, ttl_days),
        ):
            if value is not None and not (value.isdigit() and int(value) > 0):
                raise TrialboxError(f"stack output {name} is not a count: {value!r}")
        return cls(
            requests_queue_url=outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
            executions_table=outputs[c.OUTPUT_EXECUTIONS_TABLE],
            traces_bucket=outputs[c.OUTPUT_TRACES_BUCKET],
            tasksets_bucket=outputs[c.OUTPUT_TASKSETS_BUCKET],
            rollout_arn=outputs.get(c.OUTPUT_ROLLOUT_ARN),
            admission_table=outputs.get(c.OUTPUT_ADMISSION_TABLE),
            capacity=int(capacity) if capacity else None,
            open_queue_url=outputs.get(c.OUTPUT_OPEN_QUEUE_URL),
            session_queue_prefix=outputs.get(c.OUTPUT_SESSION_QUEUE_PREFIX),
            cluster=outputs.get(c.OUTPUT_CLUSTER),
            run_code_url=outputs.get(c.OUTPUT_RUN_CODE_URL),
            result_ttl_days=int(ttl_days),
        )

    @classmethod
    def from_settings(cls, settings: ClientSettings) -> Resources:
        values = {
            c.ENV_REQUESTS_QUEUE_URL: settings.requests_queue_url,
            c.ENV_EXECUTIONS_TABLE: settings.executions_table,
            c.ENV_TRACES_BUCKET: settings.traces_bucket,
            c.ENV_TASKSETS_BUCKET: settings.tasksets_bucket,
        }
        missing = [name for name, value in values.items() if not value]
        if missing:
            raise MissingResources(missing)
        return cls(
            requests_queue_url=settings.required("requests_queue_url"),
            executions_table=settings.required("executions_table"),
            traces_bucket=settings.required("traces_bucket"),
            tasksets_bucket=settings.required("tasksets_bucket"),
            rollout_arn=settings.rollout_arn,
            admission_table=settings.admission_table,
            capacity=settings.pool_capacity,
            open_queue_url=settings.open_queue_url,
            session_queue_prefix=settings.session_queue_prefix,
            cluster=settings.cluster,
            result_ttl_days=settings.result_ttl_days,
        )
