"""Task sets, traces, the executions table and the admission table."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from trialbox.constants import TABLE_KEY, TABLE_TTL_ATTRIBUTE
from trialbox.pipeline import admission


class Storage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, trace_retention_days: int) -> None:
        super().__init__(scope, construct_id)

        def bucket(name: str, **settings: Any) -> s3.Bucket:
            return s3.Bucket(
                self,
                name,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                encryption=s3.BucketEncryption.S3_MANAGED,
                enforce_ssl=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                removal_policy=RemovalPolicy.RETAIN,
                **settings,
            )

        self.access_logs = bucket(
            "AccessLogs", lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))]
        )
        # Task sets are content-addressed and immutable; versioning keeps an overwrite visible.
        self.tasksets = bucket(
            "Tasksets",
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="tasksets/",
        )
        self.traces = bucket(
            "Traces",
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="traces/",
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(trace_retention_days))],
        )
        self.executions = dynamodb.Table(
            self,
            "Executions",
            partition_key=dynamodb.Attribute(name=TABLE_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TABLE_TTL_ATTRIBUTE,
            removal_policy=RemovalPolicy.RETAIN,
        )
        # The pool's slots and the requests admitted into executions (trialbox.pipeline.admission):
        # small items, rewritten constantly; nothing in it outlives the requests in flight.
        self.admission = dynamodb.Table(
            self,
            "Admission",
            partition_key=dynamodb.Attribute(
                name=admission.PART, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=admission.ID, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )
