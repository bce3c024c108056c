"""CDK app: the validated config from cdk.json context, then the stack. No AWS calls at synth."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import CONTEXT_KEY, StackConfig
from infra.stack import TrialboxStack

ROOT = Path(__file__).resolve().parent


def build_app(context: dict[str, Any] | None = None, outdir: str | None = None) -> cdk.App:
    """`python app.py` and pytest do not read cdk.json themselves, so it is read here, once."""
    defaults = json.loads((ROOT / "cdk.json").read_text())["context"]
    merged = defaults | (context or {})
    app = cdk.App(context=merged, outdir=outdir or os.environ.get("CDK_OUTDIR"))
    config = StackConfig.from_context(app.node.try_get_context(CONTEXT_KEY))
    TrialboxStack(app, config.stack_name, config=config)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    build_app().synth()
