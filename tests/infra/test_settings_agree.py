"""Nothing disagrees: what the stack sets, what each process reads (trialbox.settings) and
what it does with it, read from the one shared synth.

Each check compares the template with the reading process's own code, so that a default
defined twice (the worker's 60 s heartbeat against the stack's 300 s) or a ratio computed
twice (the worker's 3-heartbeat visibility against the queue's 6) fails here.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from infra.config import StackConfig
from tests.support.template import ROOT, only, resources
from trialbox import constants as c
from trialbox import settings as s
from trialbox.pipeline.stores import ObjectStore
from trialbox.sdk import Resources
from trialbox.settings import ClientSettings, EnvSettings, FunctionSettings, WorkerSettings
from trialbox.worker.loop import Worker

# What each handler reads beyond what its source shows by name (a floor, should parsing miss).
NEEDED = {
    "prepare": {"tasksets_bucket", "traces_bucket", "heartbeat_s", "execute_margin_s"},
    "dispatcher": {
        "traces_bucket",
        "rollout_arn",
        "batch_arn",
        "requests_dlq_url",
        "requests_queue_url",
        "executions_table",
        "admission_table",
    },
    "recorder": {"traces_bucket", "executions_table", "admission_table"},
    "reaper": {"session_queue_prefix", "executions_table", "admission_table", "batch_arn"},
    "dead_letters": {"rollout_arn", "batch_arn", "executions_table", "admission_table"},
    "batch": {
        "tasksets_bucket",
        "traces_bucket",
        "heartbeat_s",
        "execute_margin_s",
        "executions_table",
        "admission_table",
        "work_queue_url",
    },
    "finisher": {"traces_bucket", "executions_table", "admission_table"},
    "settle": {"traces_bucket", "executions_table", "admission_table"},
    "scaler": {
        "requests_queue_url",
        "work_queue_url",
        "open_queue_url",
        "admission_table",
        "cluster",
        "pool_service",
        "pool_name",
        "pool_min_tasks",
        "pool_max_tasks",
        "pool_slots_per_task",
        "scale_in_idle_s",
        "scaler_tick_s",
        "scaler_run_s",
    },
}


def _value(value: Any) -> str:
    """An environment value as the process sees it: an intrinsic (a resource's name, URL or
    ARN, resolved at deploy) stands in as its JSON."""
    return value if isinstance(value, str) else f"<{json.dumps(value, sort_keys=True)}>"


def functions(template: Template) -> dict[str, dict[str, str]]:
    """Each trialbox function's environment, by its handler's name ("prepare", ...)."""
    found = {}
    for function in resources(template, "AWS::Lambda::Function").values():
        props = function["Properties"]
        module, _, _ = props["Handler"].rpartition(".")
        if not module.startswith("functions."):
            continue  # the CDK's own custom-resource functions
        variables = props.get("Environment", {}).get("Variables", {})
        found[module.split(".")[1]] = {k: _value(v) for k, v in variables.items()}
    return found


def worker_container(template: Template) -> dict[str, Any]:
    (task,) = resources(template, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    return dict(container)


def worker_env(template: Template) -> dict[str, str]:
    return {e["Name"]: _value(e["Value"]) for e in worker_container(template)["Environment"]}


def work_queue(template: Template) -> dict[str, Any]:
    return dict(only(template, "AWS::SQS::Queue", "PoolWorkQueue")[1]["Properties"])


def alias(model: type[EnvSettings], field: str) -> str:
    return model.model_fields[field].alias or field


# Helpers a handler passes its settings to, and the module that defines each.
SETTINGS_HELPERS = {"recorder_for": ROOT / "trialbox" / "pipeline" / "recorder.py"}


def fields_read(handler: Path) -> set[str]:
    """The settings fields a handler module reads: `settings.<field>` and
    `settings.required("<field>")`, its own or a helper's it passes `settings` to."""
    read = set()
    tree = ast.parse(handler.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in SETTINGS_HELPERS
        ):
            read |= fields_read(SETTINGS_HELPERS[node.func.id])
        if isinstance(node, ast.Call) and _is_settings(node.func, "required"):
            (arg,) = node.args
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            read.add(arg.value)
        elif isinstance(node, ast.Attribute) and _is_settings(node) and node.attr != "required":
            read.add(node.attr)
    return read


def _is_settings(node: ast.expr, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "settings"
        and attr in (None, node.attr)
    )


@pytest.fixture(scope="module")
def heartbeat(template: Template) -> int:
    """The one heartbeat: every process given TRIALBOX_HEARTBEAT_S is given the same."""
    given = {
        name: env[c.ENV_HEARTBEAT_S]
        for name, env in functions(template).items()
        if c.ENV_HEARTBEAT_S in env
    }
    given["worker"] = worker_env(template)[c.ENV_HEARTBEAT_S]
    assert "prepare" in given  # it sets the Execute step's HeartbeatSeconds ($.job.heartbeat_s)
    assert len(set(given.values())) == 1, given
    return int(given["worker"])


def test_one_heartbeat_everywhere_and_it_is_the_default(heartbeat: int) -> None:
    assert heartbeat == StackConfig().heartbeat_s == s.HEARTBEAT_S
    # The processes' own defaults are the stack's: one left unset would still agree.
    assert WorkerSettings.model_fields["heartbeat_s"].default == heartbeat
    assert FunctionSettings.model_fields["heartbeat_s"].default == heartbeat


def test_the_worker_reads_the_heartbeat_the_stack_sets(template: Template, heartbeat: int) -> None:
    env = worker_env(template)
    assert WorkerSettings.from_env(env).heartbeat_s == heartbeat
    unset = {k: v for k, v in env.items() if k != c.ENV_HEARTBEAT_S}
    assert WorkerSettings.from_env(unset).heartbeat_s == heartbeat


def test_prepare_reads_the_heartbeat_and_margin_the_stack_sets(
    template: Template, heartbeat: int
) -> None:
    prepare = FunctionSettings.from_env(functions(template)["prepare"])
    assert prepare.heartbeat_s == heartbeat
    assert prepare.execute_margin_s == StackConfig().execute_margin_s == s.EXECUTE_MARGIN_S


class _Sqs:
    """Records the visibility the worker asks for."""

    def __init__(self) -> None:
        self.visibility: list[int] = []

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        self.visibility.append(kwargs["VisibilityTimeout"])
        return {"Messages": []}


def test_the_work_queue_visibility_is_what_the_worker_asks_for(
    template: Template, heartbeat: int
) -> None:
    visibility = work_queue(template)["VisibilityTimeout"]
    assert visibility == s.work_visibility_s(heartbeat)
    # The worker, as the container's environment configures it, receives with the same.
    settings = WorkerSettings.from_env(worker_env(template))
    sqs = _Sqs()
    worker = Worker(
        sqs=sqs,
        sfn=None,
        jobs=ObjectStore(None, settings.traces_bucket),
        queue_url=settings.work_queue_url,
        run_job=lambda job, stop: pytest.fail("no job was queued"),
        heartbeat_s=settings.heartbeat_s,
        wait_s=0,
    )
    assert worker.poll_once() is False
    assert sqs.visibility == [visibility]
    # ...and it extends the visibility on every heartbeat: a live job never reappears.
    assert visibility > heartbeat


def test_the_worker_hands_a_job_back_before_the_kill(template: Template) -> None:
    container = worker_container(template)
    env = worker_env(template)
    grace = WorkerSettings.from_env(env).stop_grace_s
    assert float(env[c.ENV_STOP_GRACE_S]) == grace == s.STOP_GRACE_S
    assert grace < container["StopTimeout"] == s.STOP_TIMEOUT_S
    unset = {k: v for k, v in env.items() if k != c.ENV_STOP_GRACE_S}
    assert WorkerSettings.from_env(unset).stop_grace_s < container["StopTimeout"]


def test_the_worker_container_sets_every_variable_the_worker_needs(template: Template) -> None:
    env = worker_env(template)
    required = {
        alias(WorkerSettings, name)
        for name, field in WorkerSettings.model_fields.items()
        if field.is_required()
    }
    assert required == {
        c.ENV_TRACES_BUCKET,
        c.ENV_WORK_QUEUE_URL,
        c.ENV_FINISH_QUEUE_URL,
        c.ENV_ADMISSION_TABLE,
        c.ENV_SESSION_QUEUE_PREFIX,
        c.ENV_OPEN_QUEUE_URL,
    }
    assert required <= env.keys()
    # Set by the stack, so that its config (cdk.json) reaches the worker: not left to defaults.
    assert {c.ENV_HEARTBEAT_S, c.ENV_RECYCLE_AFTER_JOBS, c.ENV_STOP_GRACE_S} <= env.keys()
    settings = WorkerSettings.from_env(env)  # raises, naming the variable, on a bad value
    assert settings.recycle_after_jobs == StackConfig().pool.recycle_after_jobs
    assert StackConfig().pool.recycle_after_jobs == s.RECYCLE_AFTER_JOBS
    (queue_id, _) = only(template, "AWS::SQS::Queue", "PoolWorkQueue")
    assert settings.work_queue_url == _value({"Ref": queue_id})
    (admission_id, _) = only(template, "AWS::DynamoDB::Table", "StorageAdmission")
    assert settings.admission_table == _value({"Ref": admission_id})


def test_each_function_gets_the_settings_its_handler_reads(template: Template) -> None:
    envs = functions(template)
    envs.pop("run_code")  # an SDK client: the next test
    assert envs.keys() == NEEDED.keys()
    for name, env in envs.items():
        read = fields_read(ROOT / "functions" / name / "handler.py")
        assert NEEDED[name] <= read, (name, NEEDED[name] - read)
        assert read <= FunctionSettings.model_fields.keys(), (name, read)
        missing = {alias(FunctionSettings, f) for f in read} - env.keys()
        assert not missing, f"{name} reads {sorted(missing)}, which the stack does not set"
        settings = FunctionSettings.from_env(env)
        for field in read:
            assert getattr(settings, field) is not None


def test_the_stack_defaults_are_the_settings_constants(template: Template) -> None:
    config = StackConfig()
    assert config.result_ttl_days == s.RESULT_TTL_DAYS
    assert FunctionSettings.model_fields["result_ttl_days"].default == s.RESULT_TTL_DAYS
    for name, env in functions(template).items():
        if c.ENV_RESULT_TTL_DAYS in env:
            assert FunctionSettings.from_env(env).result_ttl_days == config.result_ttl_days, name


def test_the_run_code_function_gets_what_its_sdk_client_reads(template: Template) -> None:
    """RunCode's handler is an SDK client (`Client()`): ClientSettings from its environment."""
    env = functions(template)["run_code"]
    resources = Resources.from_settings(ClientSettings.from_env(env))
    (queue_id, _) = only(template, "AWS::SQS::Queue", "IntakeRequestsQueue")
    (table_id, _) = only(template, "AWS::DynamoDB::Table", "StorageExecutions")
    assert resources.requests_queue_url == _value({"Ref": queue_id})
    assert resources.executions_table == _value({"Ref": table_id})
    assert resources.capacity == StackConfig().pool.max_workers


def test_the_scaler_reads_the_pool_s_bounds_the_stack_sets(template: Template) -> None:
    """min and max are the pool's config; a task's slots are what a worker leases."""
    scaler = FunctionSettings.from_env(functions(template)["scaler"])
    pool = StackConfig().pool
    assert (scaler.pool_min_tasks, scaler.pool_max_tasks) == (pool.min_workers, pool.max_workers)
    assert scaler.scale_in_idle_s == s.SCALE_IN_IDLE_S
    assert (scaler.scaler_tick_s, scaler.scaler_run_s) == (s.SCALER_TICK_S, s.SCALER_RUN_S)
    worker = Worker(
        sqs=None,
        sfn=None,
        jobs=ObjectStore(None, "traces"),
        queue_url="",
        run_job=lambda job, stop: pytest.fail("no job"),
        heartbeat_s=60,
    )
    assert scaler.pool_slots_per_task == worker.free_slots() == s.TASK_SLOTS
