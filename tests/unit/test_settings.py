"""trialbox.settings: one reader for every process's environment, each default defined once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trialbox import constants as c
from trialbox import settings as s
from trialbox.errors import TrialboxError
from trialbox.sandbox.config import ENV_PREFIX, SandboxConfig
from trialbox.settings import ClientSettings, EnvSettings, FunctionSettings, WorkerSettings

BUCKETS = {c.ENV_TASKSETS_BUCKET: "tasksets-b", c.ENV_TRACES_BUCKET: "traces-b"}
WORKER = {
    c.ENV_TRACES_BUCKET: "traces-b",
    c.ENV_WORK_QUEUE_URL: "https://sqs/work",
    c.ENV_FINISH_QUEUE_URL: "https://sqs/finish",
    c.ENV_ADMISSION_TABLE: "admission-t",
    c.ENV_SESSION_QUEUE_PREFIX: "stack-s-",
    c.ENV_OPEN_QUEUE_URL: "https://sqs/opens",
}


def test_from_env_reads_each_field_by_its_variable() -> None:
    settings = FunctionSettings.from_env(
        BUCKETS
        | {
            c.ENV_EXECUTIONS_TABLE: "executions",
            c.ENV_RESULT_TTL_DAYS: "7",
            c.ENV_ROLLOUT_ARN: "arn:aws:states:us-east-1:0:stateMachine:Rollout",
            c.ENV_BATCH_ARN: "arn:aws:states:us-east-1:0:stateMachine:Batch",
            c.ENV_WORK_QUEUE_URL: "https://sqs/work",
            c.ENV_REQUESTS_DLQ_URL: "https://sqs/dlq",
            c.ENV_HEARTBEAT_S: "45",
            c.ENV_EXECUTE_MARGIN_S: "30",
            c.ENV_SESSION_QUEUE_PREFIX: "Trialbox-s-",
            c.ENV_REQUESTS_QUEUE_URL: "https://sqs/requests",
            c.ENV_ADMISSION_TABLE: "admission-t",
        }
    )
    assert settings.model_dump() == {
        "tasksets_bucket": "tasksets-b",
        "traces_bucket": "traces-b",
        "executions_table": "executions",
        "result_ttl_days": 7,
        "rollout_arn": "arn:aws:states:us-east-1:0:stateMachine:Rollout",
        "batch_arn": "arn:aws:states:us-east-1:0:stateMachine:Batch",
        "work_queue_url": "https://sqs/work",
        "open_queue_url": None,
        "requests_dlq_url": "https://sqs/dlq",
        "heartbeat_s": 45,
        "execute_margin_s": 30,
        "session_queue_prefix": "Trialbox-s-",
        "requests_queue_url": "https://sqs/requests",
        "admission_table": "admission-t",
        # The scaler's, unset here: its defaults.
        "cluster": None,
        "pool_service": None,
        "pool_name": None,
        "pool_min_tasks": 0,
        "pool_max_tasks": 1,
        "pool_slots_per_task": s.TASK_SLOTS,
        "scale_in_idle_s": s.SCALE_IN_IDLE_S,
        "scaler_tick_s": s.SCALER_TICK_S,
        "scaler_run_s": s.SCALER_RUN_S,
    }


def test_from_env_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in WORKER.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(c.ENV_HEARTBEAT_S, "90")
    assert WorkerSettings.from_env().heartbeat_s == 90


def test_field_names_are_not_read_only_their_variables() -> None:
    settings = WorkerSettings.from_env(WORKER | {"heartbeat_s": "7", "HEARTBEAT_S": "7"})
    assert settings.heartbeat_s == s.HEARTBEAT_S


@pytest.mark.parametrize("empty", ["", None])
def test_unset_or_empty_variables_take_the_defaults(empty: str | None) -> None:
    blank = (
        {}
        if empty is None
        else {
            c.ENV_HEARTBEAT_S: empty,
            c.ENV_RECYCLE_AFTER_JOBS: empty,
            c.ENV_STOP_GRACE_S: empty,
        }
    )
    settings = WorkerSettings.from_env(WORKER | blank)
    assert settings.heartbeat_s == s.HEARTBEAT_S
    assert settings.recycle_after_jobs == s.RECYCLE_AFTER_JOBS
    assert settings.stop_grace_s == s.STOP_GRACE_S


def test_an_empty_optional_variable_is_none() -> None:
    settings = FunctionSettings.from_env(BUCKETS | {c.ENV_EXECUTIONS_TABLE: ""})
    assert settings.executions_table is None
    with pytest.raises(TrialboxError, match=f"^{c.ENV_EXECUTIONS_TABLE} is not set"):
        settings.required("executions_table")
    assert ClientSettings.from_env({}) == ClientSettings()


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        (c.ENV_HEARTBEAT_S, "soon", "valid integer"),
        (c.ENV_HEARTBEAT_S, "1", "greater than or equal to 5"),
        (c.ENV_RECYCLE_AFTER_JOBS, "0", "greater than or equal to 1"),
        (c.ENV_STOP_GRACE_S, "-1", "greater than 0"),
    ],
)
def test_a_bad_value_names_its_variable(variable: str, value: str, reason: str) -> None:
    with pytest.raises(TrialboxError) as exc:
        WorkerSettings.from_env(WORKER | {variable: value})
    message = str(exc.value)
    assert message.startswith("invalid environment for WorkerSettings: ")
    assert f"{variable}: " in message and reason in message
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no pydantic dump


def test_a_missing_required_variable_is_named() -> None:
    with pytest.raises(TrialboxError) as exc:
        WorkerSettings.from_env({c.ENV_TRACES_BUCKET: "traces-b"})
    assert str(exc.value) == (
        f"invalid environment for WorkerSettings: {c.ENV_WORK_QUEUE_URL}: Field required; "
        f"{c.ENV_FINISH_QUEUE_URL}: Field required; {c.ENV_ADMISSION_TABLE}: Field required; "
        f"{c.ENV_SESSION_QUEUE_PREFIX}: Field required; {c.ENV_OPEN_QUEUE_URL}: Field required"
    )


def test_every_field_is_read_from_a_trialbox_variable_or_one_ecs_sets() -> None:
    for model in (FunctionSettings, WorkerSettings, ClientSettings):
        for name, field in model.model_fields.items():
            assert field.alias, (model, name)
            ecs = field.alias in (s.ECS_METADATA_URI, s.ECS_AGENT_URI)
            assert field.alias.startswith("TRIALBOX_") or ecs, (model, name)


def test_sandbox_config_reads_its_prefixed_variables() -> None:
    config = SandboxConfig.from_env(
        {
            "TRIALBOX_SANDBOX_SLOTS": "3",
            "TRIALBOX_SANDBOX_BACKEND": "rlimit",
            "TRIALBOX_SANDBOX_STATE_DIR": "/scratch/state",
            "TRIALBOX_SANDBOX_SLOT_WAIT_S": "2.5",
            "TRIALBOX_SANDBOX_UID_BASE": "",  # empty: the default
            "SLOTS": "9",  # not its variable
        }
    )
    assert (config.slots, config.backend) == (3, "rlimit")
    assert config.state_dir == Path("/scratch/state")
    assert config.slot_wait_s == 2.5
    assert config.uid_base == SandboxConfig.model_fields["uid_base"].default
    assert {f.alias for f in SandboxConfig.model_fields.values()} == {
        f"{ENV_PREFIX}{name.upper()}" for name in SandboxConfig.model_fields
    }
    assert SandboxConfig.from_env({}) == SandboxConfig()


def test_sandbox_config_names_a_bad_variable() -> None:
    with pytest.raises(TrialboxError, match=r"TRIALBOX_SANDBOX_SLOTS: .*valid integer"):
        SandboxConfig.from_env({"TRIALBOX_SANDBOX_SLOTS": "many"})
    with pytest.raises(TrialboxError, match="TRIALBOX_SANDBOX_BACKEND: "):
        SandboxConfig.from_env({"TRIALBOX_SANDBOX_BACKEND": "docker"})


def test_settings_are_frozen() -> None:
    settings = WorkerSettings.from_env(WORKER)
    with pytest.raises(ValueError, match="frozen"):
        settings.heartbeat_s = 1  # type: ignore[misc]
    assert issubclass(SandboxConfig, EnvSettings)


def test_defaults_are_the_settings_constants() -> None:
    worker = WorkerSettings.from_env(WORKER)
    assert worker.heartbeat_s == s.HEARTBEAT_S
    assert worker.recycle_after_jobs == s.RECYCLE_AFTER_JOBS
    assert worker.stop_grace_s == s.STOP_GRACE_S
    function = FunctionSettings.from_env(BUCKETS)
    assert function.heartbeat_s == s.HEARTBEAT_S
    assert function.execute_margin_s == s.EXECUTE_MARGIN_S
    assert function.result_ttl_days == s.RESULT_TTL_DAYS
    # The worker and the functions read the same heartbeat: one variable, one default.
    assert worker.heartbeat_s == function.heartbeat_s


def test_the_defaults_fit_together() -> None:
    # Step Functions' heartbeat clock starts when a job is queued: it must cover a scale-out
    # from zero (a Fargate task start is 30-45 s, plus the alarm and scaling periods).
    assert s.HEARTBEAT_S >= 300
    # A running job is handed back before ECS's SIGKILL, with time left to answer.
    assert 0 < s.STOP_GRACE_S < s.STOP_TIMEOUT_S <= 120
    # The worker extends the visibility on every heartbeat: it outlasts at least one.
    assert s.work_visibility_s(s.HEARTBEAT_S) == s.HEARTBEAT_S * s.WORK_VISIBILITY_HEARTBEATS
    assert s.work_visibility_s(s.HEARTBEAT_S) > s.HEARTBEAT_S
    assert s.work_visibility_s(s.HEARTBEAT_S) <= 12 * 3600  # SQS's most


def test_the_worker_reads_ecs_endpoints_through_its_settings() -> None:
    ecs = {
        "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/abc",
        "ECS_AGENT_URI": "http://169.254.170.2/api/abc",
    }
    settings = WorkerSettings.from_env(WORKER | ecs)
    assert (settings.ecs_metadata_uri, settings.ecs_agent_uri) == tuple(ecs.values())
    outside = WorkerSettings.from_env(WORKER)
    assert (outside.ecs_metadata_uri, outside.ecs_agent_uri) == (None, None)


def test_what_runs_on_aws_reads_its_environment_only_through_the_settings() -> None:
    """Was a gap: the worker read ECS's endpoints from os.environ itself. The settings are the
    one reader, so each variable has one name, one default and one error when it is bad."""
    root = Path(__file__).resolve().parents[2]
    places = ["trialbox/worker", "trialbox/pipeline", "trialbox/sdk", "trialbox/integrations"]
    readers = []
    for place in [*places, "functions"]:
        for path in sorted((root / place).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and (node.value.id, node.attr) in (("os", "environ"), ("os", "getenv"))
                ):
                    readers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert readers == []
