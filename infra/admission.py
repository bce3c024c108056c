"""Who may touch the admission table (trialbox.pipeline.admission), and how: each role only the
calls its step makes. A worker writes its lease, marks the slot of the job it took, and gives
it back (a transaction of the marker and the count): what a worker's code could do with these
is skew the pool's admission, never a request's result."""

from __future__ import annotations

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam

from infra.network import WORKER_TABLE_ACTIONS
from trialbox.pipeline.admission import ID, MARKERS, PART
from trialbox.pipeline.claims import CANCELLED


def grant_admission(
    table: dynamodb.ITable,
    *,
    executions: dynamodb.ITable,
    worker: iam.IRole,
    dispatcher: iam.IRole,
    releasers: list[iam.IRole],
    reaper: iam.IRole,
    dead_letters: iam.IRole,
) -> None:
    # Admission: the leases (Query) and the count's shards (BatchGetItem: a full pool is seen
    # by a read), a redelivery's marker (GetItem), then one transaction of a count shard and
    # the marker; a release when the start failed.
    table.grant(
        dispatcher,
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
    )
    # Release: the marker (GetItem: its count shard; a dead-lettered request's says whether
    # a batch carries it), then one transaction of its delete and its count shard.
    for role in releasers:
        table.grant(role, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    # Reconcile: the markers and leases (Query), and whether their requests have a result.
    table.grant(reaper, "dynamodb:Query")
    executions.grant(reaper, "dynamodb:BatchGetItem")
    # The one sandbox_error result of a request whose execution never started (the DLQ's
    # consumer) or ended without one (the reaper).
    for role in (dead_letters, reaper):
        executions.grant(role, "dynamodb:PutItem")
    worker.add_to_principal_policy(
        iam.PolicyStatement(actions=list(WORKER_TABLE_ACTIONS), resources=[table.table_arn])
    )


def cancel_claims(table: dynamodb.ITable) -> iam.PolicyStatement:
    """A caller's cancel: the flag on a request's claim (trialbox.pipeline.claims), and only
    that attribute of the markers' partitions (fine-grained access: the markers' partition
    keys, the flag; nothing read back), so that a caller can end a run but never touch the
    pool's count, leases or holders. A stray marker a caller makes is no admission's: readers
    skip it (Admission.admitted)."""
    return iam.PolicyStatement(
        sid="CancelClaims",
        actions=["dynamodb:UpdateItem"],
        resources=[table.table_arn],
        conditions={
            "ForAllValues:StringEquals": {"dynamodb:Attributes": [PART, ID, CANCELLED]},
            "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{MARKERS}*"]},
            "StringEqualsIfExists": {"dynamodb:ReturnValues": "NONE"},
        },
    )
