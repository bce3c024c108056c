"""Lambda functions: ARM64, Powertools, an explicit log group and a role of their own.

The code asset is built without Docker: a local bundler pip-installs the locked runtime
dependencies for aarch64 into the asset and copies `trialbox/` and `functions/` next to them.
The lock (`functions/requirements.lock`, from `make lock`) pins every transitive dependency
with its hashes, and pip installs it with `--require-hashes --no-deps`: the bundle holds
exactly what the lock names, or bundling fails. boto3 is in it (see functions/requirements.in).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import BundlingOptions, DockerImage, Duration, ILocalBundling, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.nag import XRAY, acknowledge
from trialbox import aws_retries
from trialbox.constants import METRICS_NAMESPACE

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "functions" / "requirements.lock"
RUNTIME = lambda_.Runtime.PYTHON_3_13
# The interpreter and platform the lock is compiled for (Makefile `lock`) and installed for.
PIP_TARGET = (
    "--platform", "manylinux2014_aarch64", "--implementation", "cp",
    "--python-version", "3.13", "--only-binary=:all:",
)  # fmt: skip


def _source_hash() -> str:
    """The asset's identity: the lock's bytes and every source file, so that a new pin or a
    new hash is a new asset even when no source changed."""
    digest = hashlib.sha256(LOCK.read_bytes())
    for package in ("trialbox", "functions"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@jsii.implements(ILocalBundling)
class LocalBundler:
    def __init__(self, lock: Path = LOCK) -> None:
        self.lock = lock

    def try_bundle(self, output_dir: str, *, image: Any = None, **_: Any) -> bool:
        out = Path(output_dir)
        # pip's own cache (~/.cache/pip, or PIP_CACHE_DIR) keeps the wheels between bundles.
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "-q", "--target", str(out),
                *PIP_TARGET, "--require-hashes", "--no-deps", "-r", str(self.lock),
            ],
            check=True,
        )  # fmt: skip
        for package in ("trialbox", "functions"):
            shutil.copytree(
                ROOT / package,
                out / package,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )
        return True


def lambda_code() -> lambda_.Code:
    return lambda_.Code.from_asset(
        str(ROOT / "functions"),
        asset_hash=_source_hash(),
        bundling=BundlingOptions(
            image=DockerImage.from_registry("local-bundling-only"), local=LocalBundler()
        ),
    )


class TrialboxFunction(Construct):
    """One Lambda function: `functions/<name>/handler.py`'s `handler`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        code: lambda_.Code,
        environment: dict[str, str],
        log_retention_days: int,
        timeout: Duration | None = None,
        memory_mb: int = 512,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=lambda_.Architecture.ARM_64,
            handler=f"functions.{name}.handler.handler",
            code=code,
            role=self.role,
            timeout=timeout or Duration.seconds(30),
            memory_size=memory_mb,
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE,
            environment={
                "POWERTOOLS_SERVICE_NAME": service_name(name),
                "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
                # The handlers' boto3 clients retry throttles and 5xx (trialbox.aws_retries).
                **aws_retries.ENVIRONMENT,
                **environment,
            },
        )
        self.log_group.grant_write(self.role)
        acknowledge(
            self,
            {
                "AwsSolutions-L1": (
                    "python3.13 is pinned on purpose: the bundle's binary wheels are built for it"
                ),
                "AwsSolutions-IAM5[Resource::*]": XRAY,
            },
        )


def service_name(name: str) -> str:
    """A function's Powertools service: its log field and its metrics' `service` dimension."""
    return f"trialbox-{name}"


RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    7: logs.RetentionDays.ONE_WEEK,
    30: logs.RetentionDays.ONE_MONTH,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


def retention(days: int) -> logs.RetentionDays:
    """StackConfig admits only the keys of RETENTION."""
    return RETENTION[days]
