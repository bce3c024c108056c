"""SandboxFusion's POST /run_code on AWS: the RunCode function behind a function URL with IAM
auth (no API Gateway, so no 29 s integration timeout). It sends each call into the pipeline
as an ungraded request and polls its result, as the SDK does, and cancels a call that misses
its deadline; `trialbox sandbox-fusion-proxy` on the trainer node signs the calls
(docs/integrations.md)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.admission import cancel_claims
from infra.lambdas import TrialboxFunction
from infra.nag import acknowledge, executions_finding, grant_objects
from trialbox import keys
from trialbox.constants import RUN_CODE_TIMEOUT_S

RUN_CODE_TIMEOUT = Duration.seconds(RUN_CODE_TIMEOUT_S)


class RunCode(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: TrialboxFunction,
        requests: sqs.IQueue,
        table: dynamodb.ITable,
        admission: dynamodb.ITable,
        traces: s3.IBucket,
        rollout: sfn.StateMachine,
        max_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = function.function
        # At most this many calls at once (Lambda answers more with 429, which the proxy
        # turns into the 504 verl retries). The pool's own load is held by the dispatcher's
        # admission, so this is the account's Lambda budget (run_code_concurrency), not 4 x
        # the pool: a pool of 1,000 would otherwise reserve 4,000 and fail the deploy.
        cfn = self.function.node.default_child
        assert isinstance(cfn, lambda_.CfnFunction)
        cfn.reserved_concurrent_executions = max_concurrency
        self.url = self.function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        function.role.add_to_principal_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[requests.queue_arn])
        )
        table.grant(function.role, "dynamodb:BatchGetItem")
        # A call that misses its deadline is cancelled, as the SDK cancels: a conditional
        # PutItem of its `cancelled` result, then its claim flagged and StopExecution, so
        # that its sandbox is killed and its slot freed.
        table.grant(function.role, "dynamodb:PutItem")
        function.role.add_to_principal_policy(cancel_claims(admission))
        rollout.grant_execution(function.role, "states:StopExecution")
        acknowledge(
            function.role,
            {executions_finding(rollout): "StopExecution on the Rollout's own executions"},
        )
        payloads = {f"{keys.PAYLOADS_PREFIX}*": "a call over 128 KiB is sent by reference"}
        results = {f"{keys.TRACES_PREFIX}*": "a result over 300 KB is read from its trace"}
        grant_objects(function.role, traces, reads=results, puts=payloads)
