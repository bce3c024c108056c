"""Who calls the twin's AWS side. Each principal signs its requests with an access key id of
its own (moto accepts any), so that the twin's request log says who made every call:
tests/iam checks each call against that principal's IAM statements in the template."""

from __future__ import annotations

SDK = "local"  # the SDK and `trialbox run`: TrialboxClientPolicy
SETUP = "twin-setup"  # creating the stack's resources: CloudFormation's work, no role's
WORKER = "twin-worker"  # the pool workers: the ECS task role
# moto's interpreter signs every service call a state machine makes with this fixed key
# (moto/stepfunctions/parser/asl/utils/boto_client.py): the state machines' roles.
STATE_MACHINES = "ak"
FUNCTION_PREFIX = "twin-fn-"


def function(name: str) -> str:
    """A Lambda function's key (its logical id): its handler's calls, and its event source
    mapping's, which Lambda makes with the function's execution role."""
    return f"{FUNCTION_PREFIX}{name}"
