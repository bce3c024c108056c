"""The Rollout state machine: Prepare -> Execute (pool worker, task token) -> Record, which scores
the run the worker answered and records its result (one step: one invocation and transition
fewer per sample than a Score step of its own, and no scored result passed through S3).

Every failure is caught into Record with its error class, so every execution ends with one
terminal result. Only a lost sandbox is retried (heartbeat or token timeout); a policy timeout
is a completed run the worker reports with SendTaskSuccess, so it is never retried.

Execute's clocks start when its work message is sent, not when a worker takes it. When one
lapses, the request's admission marker (trialbox.pipeline.admission) says which it was: no
worker took the job (capacity lost after admission) and it is sent again uncounted, up to the
job's max_waits; or a worker did, and it is a lost sandbox, retried LOST_SANDBOX_RETRIES times.
The happy path: Prepare, Execute, Record.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.alarms import at_least
from infra.lambdas import TrialboxFunction, retention
from infra.nag import acknowledge, logical_id
from trialbox import constants as c
from trialbox.models import Status, result_for
from trialbox.models.jobs import JobRef
from trialbox.pipeline.admission import ID, LOST, PART, TAKEN_BY

RECORD_FAILED = "the result could not be recorded (Record failed; see the execution's history)"
# CDK's LambdaInvoke retries Lambda's service errors already; a throttle at scale is one more
# transient error, never the request's fault.
LAMBDA_THROTTLED = ["Lambda.TooManyRequestsException"]


def retry_throttles(step: tasks.LambdaInvoke) -> tasks.LambdaInvoke:
    """Lambda's throttle retried with backoff and jitter: never the request's fault."""
    step.add_retry(
        errors=LAMBDA_THROTTLED,
        interval=Duration.seconds(2),
        max_attempts=6,
        backoff_rate=2,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return step


class Orchestration(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        prepare: TrialboxFunction,
        recorder: TrialboxFunction,
        work_queue: sqs.IQueue,
        table: dynamodb.ITable,
        admission: dynamodb.ITable,
        log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)

        def invoke(name: str, function: TrialboxFunction, result_path: str) -> tasks.LambdaInvoke:
            step = tasks.LambdaInvoke(
                self,
                name,
                lambda_function=function.function,
                payload_response_only=True,
                result_path=result_path,
            )
            return retry_throttles(step)

        record = invoke("Record", recorder, sfn.JsonPath.DISCARD)
        record.add_retry(errors=["States.ALL"], max_attempts=3, interval=Duration.seconds(1))
        record.add_catch(
            self._record_failed(table), errors=["States.ALL"], result_path="$.record_error"
        )
        prepare_step = invoke("Prepare", prepare, "$.job")
        execute = tasks.SqsSendMessage(
            self,
            "Execute",
            queue=work_queue,
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            message_body=sfn.TaskInput.from_object(
                {
                    "task_token": sfn.JsonPath.task_token,
                    "request_id": sfn.JsonPath.string_at("$.request_id"),
                    "job_uri": sfn.JsonPath.string_at("$.job.job_uri"),
                    # Lost sandboxes before this attempt: the worker passes it on, the result
                    # counts it.
                    "attempt": sfn.JsonPath.number_at("$.job.attempt"),
                }
            ),
            heartbeat_timeout=sfn.Timeout.at("$.job.heartbeat_s"),
            task_timeout=sfn.Timeout.at("$.job.timeout_s"),
            result_path="$.execution",
        )
        execute.add_catch(
            self._lapsed(execute, record, admission),
            errors=list(c.EXECUTE_LOST_ERRORS),
            result_path="$.error",
        )
        for step in (prepare_step, execute):
            step.add_catch(record, errors=["States.ALL"], result_path="$.error")
        definition = prepare_step.next(execute).next(record)
        self.rollout = standard_state_machine(
            self, "Rollout", definition, [prepare, recorder], log_retention_days
        )
        # Every failure is caught into Record, so a failed execution means Record's own
        # fallback failed too: a request without a terminal result.
        self.failed_alarm = at_least(
            self,
            "ExecutionsFailed",
            self.rollout.metric_failed(period=Duration.minutes(1), statistic="Sum"),
            1,
            "a Rollout execution ended without a terminal result",
        )

    def _lapsed(
        self, execute: sfn.State, record: sfn.State, admission: dynamodb.ITable
    ) -> sfn.IChainable:
        """Execute failed with a lost sandbox's error: was its job ever taken? A marker with
        no taker is a job that waited (sent again, uncounted, up to max_waits); one taken, one
        the reaper found lost (its taker's lease lapsed), none left, or one that cannot be
        read, a lost sandbox, whose retry's marker then names no taker."""
        key = {
            PART: tasks.DynamoAttributeValue.from_string(
                sfn.JsonPath.string_at("$.job.admission_part")
            ),
            ID: tasks.DynamoAttributeValue.from_string(sfn.JsonPath.string_at("$.request_id")),
        }
        taken = tasks.DynamoGetItem(
            self,
            "WasItTaken",
            table=admission,
            key=key,
            consistent_read=True,
            projection_expression=[
                tasks.DynamoProjectionExpression().with_attribute(TAKEN_BY),
                tasks.DynamoProjectionExpression().with_attribute(LOST),
            ],
            result_path="$.admission",
        )
        taken.add_retry(errors=["States.ALL"], max_attempts=4, interval=Duration.seconds(1))

        def count(name: str, field: str) -> sfn.Pass:
            job = {
                f"{key}.$": f"$.job.{key}"
                for key in JobRef.model_fields
                if key not in ("attempt", "waited")
            }
            other = "waited" if field == "attempt" else "attempt"
            return sfn.Pass(
                self,
                name,
                parameters=job
                | {
                    f"{field}.$": f"States.MathAdd($.job.{field}, 1)",
                    f"{other}.$": f"$.job.{other}",
                },
                result_path="$.job",
            )

        not_taken = sfn.Pass(
            self,
            "NeverTaken",
            parameters={
                "Error": c.ERROR_NOT_TAKEN,
                "Cause.$": (
                    "States.Format('no worker took the job in {} lapses of its heartbeat "
                    "(the pool lost the capacity it was admitted on)', $.job.waited)"
                ),
            },
            result_path="$.error",
        ).next(record)
        waited = (
            sfn.Choice(self, "WaitedTooLong")
            .when(
                sfn.Condition.number_greater_than_equals_json_path(
                    "$.job.waited", "$.job.max_waits"
                ),
                not_taken,
            )
            .otherwise(count("CountWait", "waited").next(execute))
        )
        # The lost sandbox is counted once: its retry's marker names no taker, so a wait of
        # the retry for a busy pool is a wait (red team 25: the dead worker's name on it made
        # each lapse of the retry's wait another lost sandbox).
        count_lost = count("CountLost", "attempt").next(execute)
        clear = tasks.DynamoUpdateItem(
            self,
            "ClearTaker",
            table=admission,
            key=key,
            update_expression=f"REMOVE {TAKEN_BY}, {LOST}",
            condition_expression=f"attribute_exists({ID})",
            result_path=sfn.JsonPath.DISCARD,
        )
        clear.add_retry(errors=["States.ALL"], max_attempts=4, interval=Duration.seconds(1))
        clear.add_catch(count_lost, errors=["States.ALL"], result_path="$.admission_error")
        lost = (
            sfn.Choice(self, "RetriesLeft")
            .when(
                sfn.Condition.number_less_than("$.job.attempt", c.LOST_SANDBOX_RETRIES),
                clear.next(count_lost),
            )
            .otherwise(record)
        )
        # A marker that cannot be read (past its retries) proves no wait: a lost sandbox.
        taken.add_catch(lost, errors=["States.ALL"], result_path="$.admission_error")
        return taken.next(
            sfn.Choice(self, "Taken")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.admission.Item"),
                    sfn.Condition.is_not_present(f"$.admission.Item.{TAKEN_BY}"),
                    sfn.Condition.is_not_present(f"$.admission.Item.{LOST}"),
                ),
                waited,
            )
            .otherwise(lost)
        )

    def _record_failed(self, table: dynamodb.ITable) -> sfn.IChainable:
        """The last resort when Record itself fails: a `sandbox_error` item written by Step
        Functions, so that even then the request ends with its one terminal result. A result
        Record did write wins (the put is conditional)."""
        # The same result every other failure gets: built by result_for (REWARD_RULES).
        fallback = result_for(
            None,
            Status.SANDBOX_ERROR,
            error=RECORD_FAILED,
            feedback=f"sandbox error (not your code): {RECORD_FAILED}",
        ).model_dump(mode="json", exclude_defaults=True, exclude={"request_id"})
        describe = sfn.Pass(
            self,
            "DescribeRecordFailure",
            parameters={"request_id.$": "$.request_id", **fallback},
            result_path="$.fallback",
        )
        put = tasks.DynamoPutItem(
            self,
            "RecordFailed",
            table=table,
            item={
                c.TABLE_KEY: tasks.DynamoAttributeValue.from_string(
                    sfn.JsonPath.string_at("$.request_id")
                ),
                "status": tasks.DynamoAttributeValue.from_string(fallback["status"]),
                "loss_mask": tasks.DynamoAttributeValue.from_boolean(fallback["loss_mask"]),
                "result": tasks.DynamoAttributeValue.from_string(
                    sfn.JsonPath.json_to_string(sfn.JsonPath.object_at("$.fallback"))
                ),
            },
            condition_expression=f"attribute_not_exists({c.TABLE_KEY})",
            result_path=sfn.JsonPath.DISCARD,
        )
        put.add_catch(
            sfn.Succeed(self, "AlreadyRecorded"),
            errors=["DynamoDB.ConditionalCheckFailedException"],
        )
        return describe.next(put)


def standard_state_machine(
    scope: Construct,
    construct_id: str,
    definition: sfn.IChainable,
    functions: list[TrialboxFunction],
    log_retention_days: int,
    name: str | None = None,
) -> sfn.StateMachine:
    """A STANDARD state machine, traced, logging every state to a log group of its own; its
    wildcard grants (X-Ray, log delivery, the functions' versions) acknowledged."""
    log_group = logs.LogGroup(
        scope,
        "Logs",  # one state machine a construct
        retention=retention(log_retention_days),
        removal_policy=RemovalPolicy.DESTROY,
    )
    machine = sfn.StateMachine(
        scope,
        construct_id,
        state_machine_name=name,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        state_machine_type=sfn.StateMachineType.STANDARD,
        tracing_enabled=True,
        logs=sfn.LogOptions(
            destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False
        ),
    )
    acknowledge(
        machine,
        {
            "AwsSolutions-IAM5[Resource::*]": (
                "X-Ray tracing and the CloudWatch Logs delivery actions Step Functions "
                "logging needs have no resource-level permissions"
            ),
            **{
                f"AwsSolutions-IAM5[Resource::<{logical_id(fn.function)}.Arn>:*]": (
                    "Step Functions invokes the function's versions and aliases"
                )
                for fn in functions
            },
        },
    )
    return machine
