"""StackConfig: the validated `cdk.json` context. A bad value fails synth with its name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trialbox.settings import EXECUTE_MARGIN_S, HEARTBEAT_S, RECYCLE_AFTER_JOBS, RESULT_TTL_DAYS

CONTEXT_KEY = "trialbox"
# Amazon ECS service quotas: "Tasks per service", 5,000 (not adjustable).
MAX_TASKS_PER_SERVICE = 5000
# Lambda keeps this much of an account's concurrency unreserved (Lambda quotas): a reservation
# that leaves less fails the deploy.
LAMBDA_UNRESERVED = 100

# Fargate's valid (cpu units -> memory MiB) pairs for ARM64 tasks.
FARGATE_MEMORY = {
    256: range(512, 2049, 512),
    512: range(1024, 4097, 1024),
    1024: range(2048, 8193, 1024),
    2048: range(4096, 16385, 1024),
    4096: range(8192, 30721, 1024),
}


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_workers: int = Field(default=0, ge=0, le=1000)
    max_workers: int = Field(default=10, ge=1)
    cpu: int = 1024
    memory_mb: int = 2048
    spot: bool = True  # beyond the on-demand base, tasks run on Fargate Spot (else on demand)
    # The first `on_demand_base` tasks run on demand (Spot never reclaims them); beyond the
    # base, tasks split `on_demand_weight` : 1 between on demand and Spot (0: all Spot).
    on_demand_base: int = Field(default=0, ge=0)
    on_demand_weight: int = Field(default=0, ge=0, le=1000)
    # Jobs a worker task runs before it exits for a fresh one. Between two jobs it wipes what
    # the slot uids left and takes no further job unless the check finds nothing (tests/fargate
    # proves the wipe complete). 1 = a fresh microVM per job, at a 30-45 s task start each.
    recycle_after_jobs: int = Field(default=RECYCLE_AFTER_JOBS, ge=1, le=100_000)

    @model_validator(mode="after")
    def _valid(self) -> PoolConfig:
        if self.max_workers > MAX_TASKS_PER_SERVICE:
            raise ValueError(
                f"pool.max_workers {self.max_workers} is over {MAX_TASKS_PER_SERVICE:,}, the most "
                "tasks one ECS service runs (Amazon ECS service quotas: tasks per service); "
                "deploy a second stack for more"
            )
        if self.min_workers > self.max_workers:
            raise ValueError("pool.min_workers must not exceed pool.max_workers")
        if self.on_demand_base > self.max_workers:
            raise ValueError("pool.on_demand_base must not exceed pool.max_workers")
        if not self.spot and (self.on_demand_base or self.on_demand_weight):
            raise ValueError(
                "pool.on_demand_base and pool.on_demand_weight split tasks between on demand "
                "and Spot: with pool.spot false every task is on demand already; drop them"
            )
        if self.cpu not in FARGATE_MEMORY:
            raise ValueError(f"pool.cpu must be one of {sorted(FARGATE_MEMORY)}")
        if self.memory_mb not in FARGATE_MEMORY[self.cpu]:
            allowed = FARGATE_MEMORY[self.cpu]
            raise ValueError(
                f"pool.memory_mb {self.memory_mb} is not valid with cpu {self.cpu} "
                f"({allowed.start}-{allowed.stop - 1} in steps of {allowed.step})"
            )
        return self


class StackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stack_name: str = Field(default="Trialbox", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
    pool: PoolConfig = Field(default_factory=PoolConfig)
    # Defaults are trialbox.settings' (HEARTBEAT_S says why 300 s): nothing disagrees.
    heartbeat_s: int = Field(default=HEARTBEAT_S, ge=5, le=3600, description="worker liveness")
    execute_margin_s: int = Field(
        default=EXECUTE_MARGIN_S, ge=10, description="beyond the runner's deadline"
    )
    trace_retention_days: int = Field(default=30, ge=1)
    result_ttl_days: int = Field(default=RESULT_TTL_DAYS, ge=1)
    log_retention_days: Literal[1, 7, 30, 90, 180, 365] = 30
    dispatcher_batch_size: int = Field(default=10, ge=1, le=10)
    # POST /run_code calls answered at once (RunCode's reserved concurrency; Lambda answers the
    # next 429). Not tied to the pool's size: admission holds the pool's load server-side.
    run_code_concurrency: int = Field(default=100, ge=1, description="/run_code calls at once")
    lambda_concurrency_quota: int = Field(
        default=1000, ge=LAMBDA_UNRESERVED + 1, description="the account's Lambda concurrency"
    )
    # Alarms go to an SNS topic; with an address, the topic also emails it (confirm the
    # subscription from the first message). None: the topic has no subscriber.
    alarm_email: str | None = Field(
        default=None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="who is paged"
    )

    @model_validator(mode="after")
    def _fits_the_account(self) -> StackConfig:
        room = self.lambda_concurrency_quota - LAMBDA_UNRESERVED
        if self.run_code_concurrency > room:
            raise ValueError(
                f"run_code_concurrency {self.run_code_concurrency} leaves Lambda less than the "
                f"{LAMBDA_UNRESERVED} unreserved it keeps of lambda_concurrency_quota "
                f"{self.lambda_concurrency_quota}: at most {room}, or raise the quota "
                "(Service Quotas) and lambda_concurrency_quota with it"
            )
        return self

    @classmethod
    def from_context(cls, context: dict[str, Any] | None) -> StackConfig:
        try:
            return cls.model_validate(context or {})
        except ValidationError as exc:
            lines = [
                f"  {'.'.join([CONTEXT_KEY, *map(str, e['loc'])])}: "
                + e["msg"].removeprefix("Value error, ")
                for e in exc.errors()
            ]
            raise SystemExit("invalid cdk.json context:\n" + "\n".join(lines)) from None
