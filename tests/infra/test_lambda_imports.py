"""Each Lambda handler imports only what its bundle holds: the lock's packages (the twin's
functions run in the dev venv, which has more, so only this test can see a missing one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.synth_full import locked
from trialbox.local.resources import Resolver
from trialbox.local.template import load_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template()
RESOLVER = Resolver(TEMPLATE)
# Each function of the template: its handler module and its environment, as deployed.
FUNCTIONS = {
    resource["Properties"]["Handler"].rsplit(".", 1)[0]: RESOLVER.resolve(
        resource["Properties"].get("Environment", {}).get("Variables", {})
    )
    for resource in TEMPLATE["Resources"].values()
    if resource["Type"] == "AWS::Lambda::Function"
    and resource["Properties"]["Handler"].startswith("functions.")
}
# Imported only if present, each inside a try (botocore's CA bundle falls back to its own;
# the editable install's finder is how this venv, not Lambda, finds trialbox).
OPTIONAL = {"certifi", "setuptools"}
PROBE = """
import importlib, importlib.metadata as md, json, sys
importlib.import_module(sys.argv[1])
dists = md.packages_distributions()
tops = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
print(json.dumps(sorted({d for t in tops for d in dists.get(t, [])})))
"""
LAMBDA_ENV = {"AWS_DEFAULT_REGION": "us-east-1", "POWERTOOLS_TRACE_DISABLED": "true"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_handler_is_a_function_of_the_template() -> None:
    handlers = {f"functions.{p.parent.name}.handler" for p in ROOT.glob("functions/*/handler.py")}
    assert handlers == set(FUNCTIONS)


@pytest.mark.parametrize("module", sorted(FUNCTIONS))
def test_the_handler_imports_only_the_locked_packages(module: str) -> None:
    env = LAMBDA_ENV | FUNCTIONS[module] | {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {normal(d) for d in json.loads(done.stdout)} - {"trialbox"}
    allowed = {normal(d) for d in locked()} | OPTIONAL
    assert sorted(imported - allowed) == []
