"""Every process the stack runs retries AWS's throttles and 5xx as trialbox.aws_retries says:
the functions (whose handlers make plain `boto3.client`s) and the worker task, by their
environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trialbox import aws_retries

if TYPE_CHECKING:
    from aws_cdk.assertions import Template

EXPECTED = {"AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "10"}


def test_the_policy_is_standard_mode_with_ten_attempts() -> None:
    assert aws_retries.ENVIRONMENT == EXPECTED
    retries = aws_retries.config().retries
    assert retries == {"mode": "standard", "total_max_attempts": 10}


def test_every_function_retries_by_the_policy(template: Template) -> None:
    functions = template.find_resources("AWS::Lambda::Function")
    ours = {
        name: props["Properties"].get("Environment", {}).get("Variables", {})
        for name, props in functions.items()
        if str(props["Properties"].get("Handler", "")).startswith("functions.")
    }
    assert len(ours) >= 5
    assert {name: {k: env.get(k) for k in EXPECTED} for name, env in ours.items()} == {
        name: EXPECTED for name in ours
    }


def test_the_worker_task_retries_by_the_policy(template: Template) -> None:
    (task,) = template.find_resources("AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    env = {v["Name"]: v["Value"] for v in container["Environment"]}
    assert {k: env.get(k) for k in EXPECTED} == EXPECTED
