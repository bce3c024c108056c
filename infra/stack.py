"""The Trialbox stack composes the constructs; the constructs build."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from infra.admission import grant_admission
from infra.batches import BatchOrchestration
from infra.client_policy import ClientPolicy
from infra.config import StackConfig
from infra.intake import DISPATCHER_TIMEOUT, Intake
from infra.lambdas import TrialboxFunction, lambda_code, service_name
from infra.monitoring import Monitoring
from infra.nag import acknowledge, executions_finding, grant_objects
from infra.network import AZS, Network
from infra.orchestration import Orchestration
from infra.pool import Pool
from infra.queues import QueueWithDlq
from infra.run_code import RUN_CODE_TIMEOUT, RunCode
from infra.scaler import SCALER_MEMORY_MB, SCALER_TIMEOUT, scaler_environment, schedule_scaler
from infra.sessions import (
    WORKER_ACTIONS,
    grant_session_queues,
    schedule_reaper,
    session_queue_prefix,
    session_queues_arn,
)
from infra.storage import Storage
from trialbox import __version__, keys
from trialbox import constants as c
from trialbox.keys import job_key
from trialbox.pipeline.batching import BATCHES_PREFIX

# Scores and records up to 10 batched samples an invocation.
FINISHER_TIMEOUT = Duration.minutes(5)


class TrialboxStack(Stack):
    @property
    def availability_zones(self) -> list[str]:
        """AZS of the region's zones, whichever region it deploys to (an environment-agnostic
        stack gets 2 from CDK): the pool's Spot capacity spread over 3 (docs/scaling.md)."""
        return [Fn.select(n, Fn.get_azs()) for n in range(AZS)]

    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig) -> None:
        super().__init__(scope, construct_id)
        storage = Storage(self, "Storage", trace_retention_days=config.trace_retention_days)
        network = Network(
            self,
            "Network",
            buckets=[storage.tasksets, storage.traces],
            admission=storage.admission,
            log_retention_days=config.log_retention_days,
        )
        buckets = {
            c.ENV_TASKSETS_BUCKET: storage.tasksets.bucket_name,
            c.ENV_TRACES_BUCKET: storage.traces.bucket_name,
        }
        intake = Intake(self, "Intake", batch_size=config.dispatcher_batch_size)
        # A batched sample's end, from its worker to the finisher (docs/batches.md).
        finish = QueueWithDlq(
            self,
            "Finish",
            visibility=Duration.seconds(FINISHER_TIMEOUT.to_seconds() * 6),
            max_age=Duration.minutes(10),
        )
        pool = Pool(
            self,
            "Pool",
            config=config.pool,
            vpc=network.vpc,
            subnets=network.subnets,
            security_groups=[network.workers_sg],
            heartbeat_s=config.heartbeat_s,
            environment={
                c.ENV_TRACES_BUCKET: storage.traces.bucket_name,
                c.ENV_HEARTBEAT_S: str(config.heartbeat_s),
                c.ENV_ADMISSION_TABLE: storage.admission.table_name,
                c.ENV_FINISH_QUEUE_URL: finish.queue.queue_url,
                c.ENV_SESSION_QUEUE_PREFIX: session_queue_prefix(config.stack_name),
            },
            log_retention_days=config.log_retention_days,
        )
        code = lambda_code()

        def function(
            name: str, env: dict[str, str], timeout: Duration, memory_mb: int = 512
        ) -> TrialboxFunction:
            return TrialboxFunction(
                self,
                name.title().replace("_", ""),
                name=name,
                code=code,
                environment=env,
                log_retention_days=config.log_retention_days,
                timeout=timeout,
                memory_mb=memory_mb,
            )

        prepare_env = {
            c.ENV_HEARTBEAT_S: str(config.heartbeat_s),
            c.ENV_EXECUTE_MARGIN_S: str(config.execute_margin_s),
        }
        prepare = function("prepare", buckets | prepare_env, Duration.seconds(30))
        table_env = {
            c.ENV_EXECUTIONS_TABLE: storage.executions.table_name,
            c.ENV_RESULT_TTL_DAYS: str(config.result_ttl_days),
        }
        admission_env = {c.ENV_ADMISSION_TABLE: storage.admission.table_name}
        # Record scores the run a worker answered (its job and report) and records the result.
        recorder = function("recorder", buckets | table_env | admission_env, Duration.seconds(60))
        orchestration = Orchestration(
            self,
            "Orchestration",
            prepare=prepare,
            recorder=recorder,
            work_queue=pool.work.queue,
            table=storage.executions,
            admission=storage.admission,
            log_retention_days=config.log_retention_days,
        )
        batch_run = function(
            "batch",
            buckets
            | prepare_env
            | table_env
            | admission_env
            | {c.ENV_WORK_QUEUE_URL: pool.work.queue.queue_url},
            Duration.seconds(60),
        )
        settle = function("settle", buckets | table_env | admission_env, Duration.seconds(60))
        finisher = function("finisher", buckets | table_env | admission_env, FINISHER_TIMEOUT)
        finisher.function.add_event_source(
            SqsEventSource(finish.queue, batch_size=10, report_batch_item_failures=True)
        )
        batches = BatchOrchestration(
            self,
            "BatchOrchestration",
            run=batch_run,
            settle=settle,
            name=f"{config.stack_name[:74]}-Batch",  # a state machine name: 80 at most
            log_retention_days=config.log_retention_days,
        )
        rollout_env = {
            c.ENV_ROLLOUT_ARN: orchestration.rollout.state_machine_arn,
            c.ENV_BATCH_ARN: batches.state_machine.state_machine_arn,
        }
        dispatcher = function(
            "dispatcher",
            buckets
            | table_env
            | admission_env
            | rollout_env
            | {
                c.ENV_REQUESTS_DLQ_URL: intake.requests.dlq.queue_url,
                c.ENV_REQUESTS_QUEUE_URL: intake.requests.queue.queue_url,
            },
            DISPATCHER_TIMEOUT,
        )
        dead_letters = function(
            "dead_letters", buckets | table_env | admission_env | rollout_env, Duration.seconds(30)
        )
        intake.attach(dispatcher, dead_letters)
        session_prefix = session_queue_prefix(config.stack_name)
        reaper = function(
            "reaper",
            buckets
            | table_env
            | admission_env
            | rollout_env
            | {c.ENV_SESSION_QUEUE_PREFIX: session_prefix},
            Duration.seconds(60),
        )
        schedule_reaper(self, reaper, session_prefix)
        scaler = function(
            "scaler",
            buckets
            | scaler_environment(pool, config.pool, intake.requests.queue, storage.admission),
            SCALER_TIMEOUT,
            SCALER_MEMORY_MB,
        )
        schedule_scaler(self, scaler, pool, intake.requests.queue, storage.admission)

        # Each role reaches only the keys its step reads or writes (layout: trialbox.constants).
        # A sandbox worker can write reports, never job specs, results or traces.
        traces = storage.traces
        worker = pool.task_definition.task_role
        payloads = {f"{keys.PAYLOADS_PREFIX}*": "large requests, read by request id"}
        job = {job_key("*", "job.json"): "each request's job spec, by request id"}
        report = {job_key("*", "report.json"): "each request's raw run report"}
        trace = {f"{keys.TRACES_PREFIX}*": "each request's trace"}
        checkpoints = {
            f"{keys.CHECKPOINTS_PREFIX}*": "workspace snapshots, content-addressed, by sha256"
        }
        # A raw sender's large request sent inline: stored as the SDK stores one (by content).
        batch_requests = {f"{BATCHES_PREFIX}*": "each batch's requests, by batch id"}
        grant_objects(dispatcher.role, traces, reads=payloads, puts=payloads | batch_requests)
        grant_objects(
            prepare.role,
            traces,
            reads=payloads | checkpoints,
            puts=job,
            not_found="a base checkpoint that does not exist rejects the request (404)",
        )
        sessions = {f"{keys.SESSIONS_PREFIX}*": "each session's trace, a file per call"}
        grant_objects(worker, traces, reads=job | checkpoints, puts=report | checkpoints | sessions)
        grant_session_queues(worker, self, session_prefix, WORKER_ACTIONS)
        grant_objects(recorder.role, traces, reads=job | report, puts=trace)
        grant_objects(
            batch_run.role,
            traces,
            reads=batch_requests | payloads | checkpoints,
            puts=job | trace,
            not_found="a base checkpoint that does not exist rejects the request (404)",
        )
        grant_objects(settle.role, traces, reads={}, puts=trace)
        grant_objects(finisher.role, traces, reads=job | report, puts=trace)
        finish.queue.grant(worker, "sqs:SendMessage")
        pool.work.queue.grant(batch_run.role, "sqs:SendMessage")
        storage.executions.grant(settle.role, "dynamodb:BatchGetItem")
        tasksets = {"*": "task sets are content-addressed files: Prepare reads any it is named"}
        for role in (prepare.role, batch_run.role):
            grant_objects(
                role,
                storage.tasksets,
                reads=tasksets,
                puts={},
                not_found="a task set that does not exist rejects the request (NoSuchKey)",
            )
        # One conditional PutItem per result.
        for role in (recorder.role, dispatcher.role, batch_run.role, settle.role, finisher.role):
            storage.executions.grant(role, "dynamodb:PutItem")
        # The dispatcher starts nothing for a request that already ended (cancelled early).
        storage.executions.grant(dispatcher.role, "dynamodb:GetItem")
        orchestration.rollout.grant_start_execution(dispatcher.role)
        batches.state_machine.grant_start_execution(dispatcher.role)
        for machine in (orchestration.rollout, batches.state_machine):
            for role in (dispatcher.role, dead_letters.role, reaper.role):
                machine.grant_execution(role, "states:DescribeExecution")
                acknowledge(
                    role,
                    {
                        executions_finding(machine): (
                            "DescribeExecution on the state machine's own executions (did it "
                            "start? did it end?)"
                        )
                    },
                )
        # A batch's ledger answers Run's token: its last sample's finish, or Run itself (by
        # the state machine's name: its ARN would make Run's function depend on the state
        # machine that invokes it).
        answer = iam.PolicyStatement(
            actions=["states:SendTaskSuccess"], resources=[batches.arn_by_name]
        )
        for role in (batch_run.role, finisher.role):
            role.add_to_principal_policy(answer)
        grant_admission(
            storage.admission,
            executions=storage.executions,
            worker=worker,
            dispatcher=dispatcher.role,
            releasers=[
                recorder.role,
                dead_letters.role,
                reaper.role,
                batch_run.role,
                settle.role,
                finisher.role,
            ],
            reaper=reaper.role,
            dead_letters=dead_letters.role,
        )
        orchestration.rollout.grant_task_response(worker)
        run_code = RunCode(
            self,
            "SandboxFusion",
            function=function(
                "run_code",
                buckets
                | {
                    c.ENV_REQUESTS_QUEUE_URL: intake.requests.queue.queue_url,
                    c.ENV_EXECUTIONS_TABLE: storage.executions.table_name,
                    c.ENV_ROLLOUT_ARN: orchestration.rollout.state_machine_arn,
                    c.ENV_ADMISSION_TABLE: storage.admission.table_name,
                    c.ENV_POOL_CAPACITY: str(config.pool.max_workers),
                },
                RUN_CODE_TIMEOUT,
            ),
            requests=intake.requests.queue,
            table=storage.executions,
            admission=storage.admission,
            rollout=orchestration.rollout,
            traces=storage.traces,
            max_concurrency=config.run_code_concurrency,
        )
        client_policy = ClientPolicy(
            self,
            "TrialboxClientPolicy",
            requests=intake.requests.queue,
            tasksets=storage.tasksets,
            traces=storage.traces,
            table=storage.executions,
            admission=storage.admission,
            rollout=orchestration.rollout,
            opens=pool.opens.queue,
            session_queues=session_queues_arn(self, session_prefix),
            pool_tasks=(pool.tasks_arn, pool.tasks_finding),
            run_code=run_code.function,
        )

        # Every paging alarm in the stack, wherever it is built, goes to the topic (an aspect).
        Monitoring(
            self,
            "Monitoring",
            alarm_email=config.alarm_email,
            recorder_service=service_name("recorder"),
        ).route(self)

        outputs = {
            c.OUTPUT_REQUESTS_QUEUE_URL: intake.requests.queue.queue_url,
            c.OUTPUT_WORK_QUEUE_URL: pool.work.queue.queue_url,
            c.OUTPUT_SESSION_QUEUE_PREFIX: session_prefix,
            c.OUTPUT_OPEN_QUEUE_URL: pool.opens.queue.queue_url,
            c.OUTPUT_TASKSETS_BUCKET: storage.tasksets.bucket_name,
            c.OUTPUT_TRACES_BUCKET: storage.traces.bucket_name,
            c.OUTPUT_EXECUTIONS_TABLE: storage.executions.table_name,
            c.OUTPUT_ADMISSION_TABLE: storage.admission.table_name,
            c.OUTPUT_ROLLOUT_ARN: orchestration.rollout.state_machine_arn,
            c.OUTPUT_BATCH_ARN: batches.state_machine.state_machine_arn,
            c.OUTPUT_FINISH_QUEUE_URL: finish.queue.queue_url,
            c.OUTPUT_POOL_CAPACITY: str(config.pool.max_workers),
            c.OUTPUT_RESULT_TTL_DAYS: str(config.result_ttl_days),
            c.OUTPUT_CLUSTER: pool.cluster.cluster_name,
            c.OUTPUT_CLIENT_POLICY_ARN: client_policy.policy.managed_policy_arn,
            c.OUTPUT_RUN_CODE_URL: run_code.url.url,
            c.OUTPUT_STACK_VERSION: __version__,  # the SDK refuses a stack of another major.minor
        }
        for name, value in outputs.items():
            CfnOutput(self, name, value=value, export_name=f"{config.stack_name}-{name}")
