"""The twin's rate quotas scaled down (trialbox.local.faults): a token bucket per operation,
which throttles the project's calls past it, as AWS throttles past an account's quota."""

from __future__ import annotations

import json

import pytest

from trialbox.errors import TrialboxError
from trialbox.local.faults import ENV_QUOTAS, RateQuota, environment, operation


def test_a_quota_lets_its_bucket_through_then_its_refill() -> None:
    quota = RateQuota(per_s=0.01, bucket=2.0)  # a call each 100 s
    assert [quota.take(), quota.take(), quota.take()] == [True, True, False]
    quota.at -= 100  # 100 s on: one call more
    assert [quota.take(), quota.take()] == [True, False]


def test_the_operation_is_read_from_the_json_protocol_s_target() -> None:
    assert operation({"HTTP_X_AMZ_TARGET": "AWSStepFunctions.StartExecution"}) == "StartExecution"
    assert operation({}) is None


def test_the_services_environment_carries_the_quotas_checked() -> None:
    env = environment(0.0, quotas={"states:StartExecution": (0.5, 2.0)})
    assert json.loads(env[ENV_QUOTAS]) == {"states:StartExecution": [0.5, 2.0]}
    with pytest.raises(TrialboxError) as raised:
        environment(0.0, quotas={"states:StartExecution": (0.0, 2.0)})
    assert str(raised.value) == (
        "a quota needs a refill above 0 a second and a bucket of at least 1 call, not 0.0/s and 2.0"
    )
