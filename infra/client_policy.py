"""TrialboxClientPolicy: what a trainer needs, and nothing else.

Exactly the calls the SDK (`trialbox.sdk`) and `trialbox run --stack` make, each on the one
resource it is made on. tests/iam proves it call by call: every call a twin run records from
the SDK and the CLI is allowed here, and every grant here is used by one (or listed there
with the reason no twin run can use it).

The stack outputs the policy's ARN; an operator attaches it to the role the trainer assumes
(docs/pipeline.md, "Trainer permissions").
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Fn, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.admission import cancel_claims
from infra.nag import acknowledge, executions_finding, logical_id
from infra.sessions import CLIENT_ACTIONS, WHY, session_queue_prefix
from trialbox import keys


class ClientPolicy(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        requests: sqs.IQueue,
        tasksets: s3.IBucket,
        traces: s3.IBucket,
        table: dynamodb.ITable,
        admission: dynamodb.ITable,
        rollout: sfn.IStateMachine,
        opens: sqs.IQueue,
        session_queues: str,
        pool_tasks: tuple[str, str],
        run_code: lambda_.IFunction,
    ) -> None:
        """`pool_tasks`: the ARN pattern of the pool's tasks, and cdk-nag's name for it."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        executions = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{Fn.select(6, Fn.split(':', rollout.state_machine_arn))}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        own_stack = stack.format_arn(
            service="cloudformation", resource="stack", resource_name=f"{stack.stack_name}/*"
        )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            managed_policy_name=f"{stack.stack_name}-TrialboxClientPolicy",
            description="What the Trialbox SDK and `trialbox run --stack` call on this stack",
            statements=[
                # Client.from_stack: the stack's outputs name its resources.
                _allow("ReadStackOutputs", "cloudformation:DescribeStacks", own_stack),
                # push_taskset (trialbox run pushes each task set under tasksets/).
                _allow(
                    "PushTasksets",
                    "s3:PutObject",
                    tasksets.arn_for_objects(f"{keys.TASKSETS_PREFIX}*"),
                ),
                # submit: a request over 128 KiB goes to S3 first, then SendMessageBatch.
                _allow(
                    "PutLargeRequests",
                    "s3:PutObject",
                    traces.arn_for_objects(f"{keys.PAYLOADS_PREFIX}*"),
                ),
                _allow("SubmitRequests", "sqs:SendMessage", requests.queue_arn),
                # submit, and the pump's polls: BatchGetItem, 100 request ids at a time.
                _allow("PollResults", "dynamodb:BatchGetItem", table.table_arn),
                # cancel: a conditional PutItem of the `cancelled` result (first writer
                # wins), then the cancel flag on its claim (a sample in a batch) and
                # StopExecution of its Rollout execution (a request run alone).
                _allow("CancelResults", "dynamodb:PutItem", table.table_arn),
                cancel_claims(admission),
                _allow("StopExecutions", "states:StopExecution", executions),
                # read_object: each result's trace (trialbox run --traces-dir).
                _allow(
                    "ReadTraces", "s3:GetObject", traces.arn_for_objects(f"{keys.TRACES_PREFIX}*")
                ),
                # session(task=ref): the task (a worker hosts it without its hidden tests).
                _allow(
                    "ReadTasksets",
                    "s3:GetObject",
                    tasksets.arn_for_objects(f"{keys.TASKSETS_PREFIX}*"),
                ),
                # session: its reply queue, the workers' inboxes, and the open queue.
                iam.PolicyStatement(
                    sid="SessionQueues", actions=CLIENT_ACTIONS, resources=[session_queues]
                ),
                _allow("OpenSessions", "sqs:SendMessage", opens.queue_arn),
                # a session's worker lost mid-call: was it stopped for running out of memory?
                _allow("SessionWorkerFate", "ecs:DescribeTasks", pool_tasks[0]),
                # a call's result too large for a message: its trace file.
                _allow(
                    "ReadSessionTraces",
                    "s3:GetObject",
                    traces.arn_for_objects(f"{keys.SESSIONS_PREFIX}*"),
                ),
                # trialbox sandbox-fusion-proxy: SandboxFusion's /run_code, a function URL
                # with IAM auth, which takes both actions (function URLs since October 2025).
                iam.PolicyStatement(
                    sid="RunCodeUrl",
                    actions=["lambda:InvokeFunctionUrl"],
                    resources=[run_code.function_arn],
                    conditions={"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}},
                ),
                _allow("RunCodeInvoke", "lambda:InvokeFunction", run_code.function_arn),
            ],
        )
        tasksets_id, traces_id = logical_id(tasksets), logical_id(traces)
        acknowledge(
            self,
            {
                f"AwsSolutions-IAM5[Resource::<{tasksets_id}.Arn>/{keys.TASKSETS_PREFIX}*]": (
                    "task sets are content-addressed files the trainer pushes, one key each"
                ),
                f"AwsSolutions-IAM5[Resource::<{traces_id}.Arn>/{keys.PAYLOADS_PREFIX}*]": (
                    "large requests, one key per request id"
                ),
                f"AwsSolutions-IAM5[Resource::<{traces_id}.Arn>/{keys.TRACES_PREFIX}*]": (
                    "each result's trace, one key per request id"
                ),
                f"AwsSolutions-IAM5[Resource::<{traces_id}.Arn>/{keys.SESSIONS_PREFIX}*]": (
                    "each session's trace, a file per call"
                ),
                pool_tasks[
                    1
                ]: "a session's worker is one of the pool's tasks, whose ids ECS assigns",
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:"
                f"<AWS::AccountId>:{session_queue_prefix(stack.stack_name)}*]": WHY,
                executions_finding(rollout): (
                    "StopExecution on the Rollout's own executions, one per request id"
                ),
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:cloudformation:<AWS::Region>:"
                f"<AWS::AccountId>:stack/{stack.stack_name}/*]": (
                    "this stack only; its ARN ends in an id CloudFormation assigns at creation"
                ),
            },
        )


def _allow(sid: str, action: str, resource: str) -> iam.PolicyStatement:
    return iam.PolicyStatement(sid=sid, actions=[action], resources=[resource])
