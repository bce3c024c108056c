"""One synth for every template assertion (validator off; cdk-nag on, as on every synth)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def app() -> cdk.App:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ["CDK_VALIDATION"] = "false"
    sys.path.insert(0, str(ROOT))
    from app import build_app

    return build_app(context={"aws:cdk:bundling-stacks": []})


@pytest.fixture(scope="session")
def template(app: cdk.App) -> Template:
    stack = app.node.find_child("Trialbox")
    return Template.from_stack(stack)  # type: ignore[arg-type]


def resources(template: Template, kind: str) -> dict[str, Any]:
    return template.find_resources(kind)
