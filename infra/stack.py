"""The Trialbox stack composes the constructs; the constructs build."""

from __future__ import annotations

from aws_cdk import CfnElement, CfnOutput, Duration, Stack
from constructs import Construct

from infra.config import StackConfig
from infra.intake import DISPATCHER_TIMEOUT, Intake
from infra.lambdas import TrialboxFunction, lambda_code
from infra.nag import suppress_known_findings
from infra.network import Network
from infra.orchestration import Orchestration
from infra.pool import Pool
from infra.storage import Storage
from trialbox import constants as c


class TrialboxStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig) -> None:
        super().__init__(scope, construct_id)
        storage = Storage(self, "Storage", trace_retention_days=config.trace_retention_days)
        network = Network(self, "Network")
        buckets = {
            c.ENV_TASKSETS_BUCKET: storage.tasksets.bucket_name,
            c.ENV_TRACES_BUCKET: storage.traces.bucket_name,
        }
        pool = Pool(
            self,
            "Pool",
            config=config.pool,
            vpc=network.vpc,
            subnets=network.subnets,
            heartbeat_s=config.heartbeat_s,
            environment={
                c.ENV_TRACES_BUCKET: storage.traces.bucket_name,
                c.ENV_HEARTBEAT_S: str(config.heartbeat_s),
            },
            log_retention_days=config.log_retention_days,
        )
        code = lambda_code()

        def function(name: str, env: dict[str, str], timeout: Duration) -> TrialboxFunction:
            return TrialboxFunction(
                self,
                name.capitalize(),
                name=name,
                code=code,
                environment=env,
                log_retention_days=config.log_retention_days,
                timeout=timeout,
            )

        prepare = function(
            "prepare",
            buckets
            | {
                c.ENV_HEARTBEAT_S: str(config.heartbeat_s),
                c.ENV_EXECUTE_MARGIN_S: str(config.execute_margin_s),
                c.ENV_QUEUE_WAIT_S: str(config.queue_wait_s),
            },
            Duration.seconds(30),
        )
        scorer = function("scorer", buckets, Duration.seconds(60))
        table_env = {
            c.ENV_EXECUTIONS_TABLE: storage.executions.table_name,
            c.ENV_RESULT_TTL_DAYS: str(config.result_ttl_days),
        }
        recorder = function("recorder", buckets | table_env, Duration.seconds(30))
        orchestration = Orchestration(
            self,
            "Orchestration",
            prepare=prepare,
            scorer=scorer,
            recorder=recorder,
            work_queue=pool.work.queue,
            table=storage.executions,
            log_retention_days=config.log_retention_days,
        )
        intake = Intake(self, "Intake", batch_size=config.dispatcher_batch_size)
        dispatcher = function(
            "dispatcher",
            buckets
            | table_env
            | {
                c.ENV_ROLLOUT_ARN: orchestration.rollout.state_machine_arn,
                c.ENV_REQUESTS_DLQ_URL: intake.requests.dlq.queue_url,
            },
            DISPATCHER_TIMEOUT,
        )
        intake.attach(dispatcher)

        # Each role reaches only the keys its step reads or writes (layout: trialbox.constants).
        # A sandbox worker can write reports, never job specs, results or traces.
        storage.tasksets.grant_read(prepare.role)
        traces = storage.traces
        worker = pool.task_definition.task_role
        payloads, job, report, result = (
            f"{c.PAYLOADS_PREFIX}*",
            f"{c.JOBS_PREFIX}*/job.json",
            f"{c.JOBS_PREFIX}*/report.json",
            f"{c.JOBS_PREFIX}*/result.json",
        )
        grants = {
            dispatcher.role: ([payloads], []),
            prepare.role: ([payloads], [job]),
            worker: ([job], [report]),
            scorer.role: ([job, report], [result]),
            recorder.role: ([result], [f"{c.TRACES_PREFIX}*"]),
        }
        for role, (reads, puts) in grants.items():
            for pattern in reads:
                traces.grant_read(role, pattern)
            for pattern in puts:
                traces.grant_put(role, pattern)
        for role in (recorder.role, dispatcher.role):  # one conditional PutItem per result
            storage.executions.grant(role, "dynamodb:PutItem")
        orchestration.rollout.grant_start_execution(dispatcher.role)
        orchestration.rollout.grant_execution(dispatcher.role, "states:DescribeExecution")
        orchestration.rollout.grant_task_response(worker)

        outputs = {
            c.OUTPUT_REQUESTS_QUEUE_URL: intake.requests.queue.queue_url,
            c.OUTPUT_WORK_QUEUE_URL: pool.work.queue.queue_url,
            c.OUTPUT_TASKSETS_BUCKET: storage.tasksets.bucket_name,
            c.OUTPUT_TRACES_BUCKET: storage.traces.bucket_name,
            c.OUTPUT_EXECUTIONS_TABLE: storage.executions.table_name,
            c.OUTPUT_ROLLOUT_ARN: orchestration.rollout.state_machine_arn,
        }
        for name, value in outputs.items():
            CfnOutput(self, name, value=value, export_name=f"{config.stack_name}-{name}")
        rollout = orchestration.rollout.node.default_child
        assert isinstance(rollout, CfnElement)
        suppress_known_findings(self, self.get_logical_id(rollout))
