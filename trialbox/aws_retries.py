"""How every AWS client of the project retries a throttle or a 5xx: botocore's standard retry
mode (its throttling codes, and any 500/502/503/504, with jittered exponential backoff capped
at 20 s) with 10 attempts instead of its default 3. At 3 attempts, one call in a thousand
still fails when 10 % of calls are throttled; at 10, one in ten billion.

In code, clients take `config()` (the SDK, the worker); in a process whose clients are made
by code outside our control (a Lambda handler's `boto3.client`), the environment does the
same (`ENVIRONMENT`: the functions' and the worker task's, from the template).
"""

from __future__ import annotations

from botocore.config import Config

RETRY_MODE = "standard"
MAX_ATTEMPTS = 10  # the first call and 9 retries
ENVIRONMENT = {"AWS_RETRY_MODE": RETRY_MODE, "AWS_MAX_ATTEMPTS": str(MAX_ATTEMPTS)}


def config() -> Config:
    """A botocore client config with the project's retry policy."""
    # total_max_attempts counts the first call, as AWS_MAX_ATTEMPTS does (`max_attempts`
    # would count only the retries).
    return Config(retries={"mode": RETRY_MODE, "total_max_attempts": MAX_ATTEMPTS})
