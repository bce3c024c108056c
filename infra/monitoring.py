"""Monitoring: the alarm topic every paging alarm sends to, and the two alarms that say a pool
fails its jobs (most results are `sandbox_error`, or most Execute attempts are lost).

One mechanism routes alarms: `at_least` makes each alarm a `PagingAlarm`, and `route` sends
every `PagingAlarm` in the stack to the topic. The pool's scaling alarms are not paging alarms:
they fire on every backlog and act on the scaling policies only.
"""

from __future__ import annotations

import jsii
from aws_cdk import ArnFormat, Aspects, Duration, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct

from infra.alarms import PagingAlarm, at_least
from trialbox import constants as c

WINDOW = Duration.minutes(5)
# A rate over fewer results than this is noise (one sandbox_error in two results is not an
# outage); a pool that fails every job reaches it within the window at any useful load.
MIN_RESULTS = 5
SANDBOX_ERROR_RATE = 0.25  # a healthy pool's sandbox_error share is near 0
LOST_RATE = 0.5  # Spot interruptions hand jobs back now and then; half of all attempts is not that
# The Execute step's service integration, as Step Functions names it in the metric's dimension:
# account-qualified and per integration type (every sqs:sendMessage.waitForTaskToken task of
# the account in the region shares it; this stack has one).
EXECUTE_INTEGRATION = "sqs:sendMessage.waitForTaskToken"


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        alarm_email: str | None,
        recorder_service: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        # CloudWatch cannot publish to a topic under the AWS-managed SNS key (its policy cannot
        # name CloudWatch), so the topic has a key of its own.
        self.key = kms.Key(
            self,
            "Key",
            description="Trialbox alarm topic",
            enable_key_rotation=True,
            pending_window=Duration.days(7),
            removal_policy=RemovalPolicy.DESTROY,
        )
        cloudwatch_principal = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[cloudwatch_principal],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # a key policy's own key
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.topic = sns.Topic(
            self, "Alarms", display_name="Trialbox alarms", master_key=self.key, enforce_ssl=True
        )
        # The topic's policy replaces SNS's default one: CloudWatch is allowed by name, for
        # this account's alarms only.
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[cloudwatch_principal],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                    "StringEquals": {"aws:SourceAccount": stack.account},
                },
            )
        )
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))

        def recorded(statistic: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace=c.METRICS_NAMESPACE,
                metric_name=c.METRIC_SANDBOX_ERROR,
                dimensions_map={"service": recorder_service},
                period=WINDOW,
                statistic=statistic,
            )

        self.sandbox_error_rate = at_least(
            self,
            "SandboxErrorRate",
            cloudwatch.MathExpression(
                expression=f"IF(results >= {MIN_RESULTS}, rate, 0)",
                using_metrics={
                    "rate": recorded("Average"),
                    "results": recorded("SampleCount"),
                },
                period=WINDOW,
                label="sandbox_error share of recorded results",
            ),
            SANDBOX_ERROR_RATE,
            "most results are sandbox_error: the pool cannot run jobs (see the worker's logs)",
        )

        def execute(metric_name: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace="AWS/States",
                metric_name=metric_name,
                dimensions_map={
                    "ServiceIntegrationResourceArn": stack.format_arn(
                        service="states",
                        resource="sqs",
                        resource_name=EXECUTE_INTEGRATION.removeprefix("sqs:"),
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                },
                statistic="Sum",
                period=WINDOW,
            )

        lost = cloudwatch.MathExpression(
            expression="FILL(timedOut, 0) + FILL(failed, 0)",
            using_metrics={
                "timedOut": execute("ServiceIntegrationsTimedOut"),
                "failed": execute("ServiceIntegrationsFailed"),
            },
            period=WINDOW,
        )
        tried = cloudwatch.MathExpression(
            expression="FILL(started, 0)",
            using_metrics={"started": execute("ServiceIntegrationsStarted")},
            period=WINDOW,
        )
        self.lost_sandboxes = at_least(
            self,
            "LostSandboxes",
            cloudwatch.MathExpression(
                # Timeouts trail their starts by a heartbeat, hence MAX: the share stays <= 1.
                expression=f"IF(tried + lost >= {MIN_RESULTS}, lost / MAX([tried, lost]), 0)",
                using_metrics={"lost": lost, "tried": tried},
                period=WINDOW,
                label="Execute attempts lost (heartbeat/token timeout) or failed by the worker",
            ),
            LOST_RATE,
            "most Execute attempts time out or fail: workers are lost, or cannot start",
        )

    def route(self, scope: Construct) -> None:
        """Send every paging alarm under `scope` to the topic, including alarms built after
        this call (an aspect, applied at synth)."""
        Aspects.of(scope).add(_RouteToTopic(cw_actions.SnsAction(self.topic)))


@jsii.implements(IAspect)
class _RouteToTopic:
    def __init__(self, action: cloudwatch.IAlarmAction) -> None:
        self.action = action

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, PagingAlarm):
            node.add_alarm_action(self.action)
