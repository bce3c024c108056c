"""The Batch state machine: one execution carries many samples (docs/batches.md).

Run (lambda:invoke.waitForTaskToken) prepares every sample and sends its work message; the
finisher answers Run's token once every sample has its result, so a batch that goes well is
one billed transition. Each sample's liveness is its claim's lease
(trialbox.pipeline.claims), not a Step Functions timer: Run's timeout is a backstop, and its
Catch, Settle, gives every sample still without a result its `sandbox_error`.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.alarms import at_least
from infra.lambdas import TrialboxFunction
from infra.orchestration import retry_throttles, standard_state_machine
from trialbox.constants import BATCH_TIMEOUT_S
from trialbox.models.batches import BatchInput


class BatchOrchestration(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        run: TrialboxFunction,
        settle: TrialboxFunction,
        name: str,
        log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        run_step = tasks.LambdaInvoke(
            self,
            "Run",
            lambda_function=run.function,
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            payload=sfn.TaskInput.from_object(
                {"batch": sfn.JsonPath.object_at("$"), "token": sfn.JsonPath.task_token}
            ),
            task_timeout=sfn.Timeout.duration(Duration.seconds(BATCH_TIMEOUT_S)),
            result_path=sfn.JsonPath.DISCARD,
        )
        retry_throttles(run_step)
        settle_step = tasks.LambdaInvoke(
            self,
            "Settle",
            lambda_function=settle.function,
            payload=sfn.TaskInput.from_object(
                {
                    "batch": {
                        field: sfn.JsonPath.object_at(f"$.{field}")
                        for field in BatchInput.model_fields
                    },
                    "error": sfn.JsonPath.object_at("$.error"),
                }
            ),
            payload_response_only=True,
            result_path=sfn.JsonPath.DISCARD,
        )
        settle_step.add_retry(
            errors=["States.ALL"], max_attempts=6, interval=Duration.seconds(2), backoff_rate=2
        )
        run_step.add_catch(settle_step, errors=["States.ALL"], result_path="$.error")
        self.state_machine = standard_state_machine(
            self, "Batch", run_step, [run, settle], log_retention_days, name=name
        )
        # Its ARN without a reference to it (a grant to the function it invokes).
        self.arn_by_name = Stack.of(self).format_arn(
            service="states",
            resource="stateMachine",
            resource_name=name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # Settle catches every failure of Run, so a failed execution means Settle failed too:
        # samples that may lack their terminal result.
        self.failed_alarm = at_least(
            self,
            "ExecutionsFailed",
            self.state_machine.metric_failed(period=Duration.minutes(1), statistic="Sum"),
            1,
            "a Batch execution ended without settling its samples",
        )
