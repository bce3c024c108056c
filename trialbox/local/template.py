"""The stack's CloudFormation template, as the twin uses it.

In a checkout the CDK app is synthesized in a subprocess (trialbox never imports `infra/`) and
cached by the hash of everything that shapes the template. A wheel ships the synthesized
template as package data instead. Asset hashes are normalized away: they change with every
source edit and mean nothing to the twin.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from trialbox.errors import TrialboxError
from trialbox.sandbox.shared_files import exclusive, publish

STACK = "Trialbox"
CHECKOUT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trialbox"
ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")
SYNTH = "from app import build_app;build_app(context={'aws:cdk:bundling-stacks': []}).synth()"


def normalize(template: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(ASSET_HASH.sub("ASSET", json.dumps(template, sort_keys=True))))


# The trialbox modules the CDK app imports: their values (names, keys, defaults) shape it.
APP_IMPORTS = (
    "constants.py",
    "keys.py",
    "settings.py",
    "aws_retries.py",
    "pipeline/admission.py",
    "pipeline/batching.py",
    "pipeline/claims.py",
    "pipeline/scaler.py",
    "models/jobs.py",
    "models/result.py",
    "models/batches.py",
    "models/sessions.py",
)


def template_sources(root: Path = CHECKOUT) -> list[Path]:
    """Everything that shapes the template, for the cache key."""
    paths = [root / "app.py", root / "cdk.json"]
    paths += [root / "trialbox" / name for name in APP_IMPORTS]
    return paths + sorted((root / "infra").rglob("*.py"))


def source_hash(root: Path = CHECKOUT) -> str:
    digest = hashlib.sha256()
    for path in template_sources(root):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def synthesize(root: Path = CHECKOUT) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as outdir:
        env = os.environ | {
            "CDK_OUTDIR": outdir,
            "CDK_VALIDATION": "false",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        }
        done = subprocess.run(
            [sys.executable, "-c", SYNTH], cwd=root, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise TrialboxError(f"cdk synth failed:\n{done.stderr[-3000:]}")
        return normalize(json.loads((Path(outdir) / f"{STACK}.template.json").read_text()))


def is_checkout(root: Path = CHECKOUT) -> bool:
    return (root / "app.py").exists() and (root / "infra").is_dir()


def shipped() -> dict[str, Any]:
    text = resources.files("trialbox.local").joinpath("data/template.json").read_text()
    return dict(json.loads(text))


def load_template() -> dict[str, Any]:
    """A checkout's fresh (cached) synth when the CDK is installed, else the shipped copy."""
    if is_checkout():
        # find_spec, not import: importing the CDK starts node (and its banner).
        if importlib.util.find_spec("aws_cdk") is None:
            return shipped()
        cached = CACHE / f"template-{source_hash()}.json"
        if not cached.exists():
            with exclusive(CACHE / ".template.lock"):  # one synth when several twins start
                if not cached.exists():
                    template = json.dumps(synthesize(), sort_keys=True)
                    publish(cached, template.encode())  # twins may read it now
        return dict(json.loads(cached.read_text()))
    return shipped()


def main() -> None:
    """`python -m trialbox.local.template`: refresh the shipped copy (`make template`)."""
    target = Path(__file__).with_name("data") / "template.json"
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(synthesize(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
