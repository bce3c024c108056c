"""One synth for every template assertion (validator off; cdk-nag on, as on every synth)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from tests.support.template import ROOT

if TYPE_CHECKING:
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

# Set as this package is collected, before anything imports the CDK: its node process keeps
# the environment it started with, so every synth in every worker runs alike, whatever ran
# first (tests/infra/test_synth_full.py turns the validator on in its own process).
os.environ["CDK_VALIDATION"] = "false"
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@pytest.fixture(scope="session")
def app() -> cdk.App:
    sys.path.insert(0, str(ROOT))
    from app import build_app

    return build_app(context={"aws:cdk:bundling-stacks": []})


@pytest.fixture(scope="session")
def template(app: cdk.App) -> Template:
    from aws_cdk.assertions import Template

    stack = app.node.find_child("Trialbox")
    return Template.from_stack(stack)  # type: ignore[arg-type]
