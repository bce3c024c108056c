"""Lambda functions: ARM64, Powertools, an explicit log group and a role of their own.

The code asset is built without Docker: a local bundler pip-installs the pinned runtime
dependencies for aarch64 into the asset and copies `trialbox/` and `functions/` next to them.
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
from trialbox.constants import METRICS_NAMESPACE

ROOT = Path(__file__).resolve().parents[1]
# What a handler imports at run time, beyond the Lambda runtime's own boto3.
LAMBDA_REQUIREMENTS = ("pydantic==2.14.4", "aws-lambda-powertools==3.37.0", "aws-xray-sdk==2.15.0")
RUNTIME = lambda_.Runtime.PYTHON_3_13


def _source_hash() -> str:
    digest = hashlib.sha256("\n".join(LAMBDA_REQUIREMENTS).encode())
    for package in ("trialbox", "functions"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@jsii.implements(ILocalBundling)
class LocalBundler:
    def try_bundle(self, output_dir: str, *, image: Any = None, **_: Any) -> bool:
        out = Path(output_dir)
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "-q", "--target", str(out),
                "--platform", "manylinux2014_aarch64", "--implementation", "cp",
                "--python-version", "3.13", "--only-binary=:all:", *LAMBDA_REQUIREMENTS,
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
