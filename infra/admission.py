"""Who may touch the admission table (trialbox.pipeline.admission), and how: each role only the
calls its step makes. A worker writes nothing but its own lease (items under `workers`)."""

from __future__ import annotations

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam

from infra.network import WORKER_TABLE_ACTIONS
from trialbox.pipeline.admission import WORKERS


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
    # Admission: the leases (Query), then one transaction of the count and a marker.
    table.grant(dispatcher, "dynamodb:Query", "dynamodb:UpdateItem", "dynamodb:PutItem")
    # Release: one transaction of the marker's delete and the count.
    for role in releasers:
        table.grant(role, "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    # Reconcile: the markers and leases (Query), and whether their requests have a result.
    table.grant(reaper, "dynamodb:Query")
    executions.grant(reaper, "dynamodb:BatchGetItem")
    executions.grant(dead_letters, "dynamodb:PutItem")  # its one sandbox_error result
    worker.add_to_principal_policy(
        iam.PolicyStatement(
            actions=list(WORKER_TABLE_ACTIONS),
            resources=[table.table_arn],
            conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [WORKERS]}},
        )
    )
