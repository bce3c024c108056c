"""The warm sandbox pool: an ECS service of Fargate workers that long-poll the work queue."""

from __future__ import annotations

import jsii
from aws_cdk import AspectPriority, Aspects, Duration, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from infra.config import PoolConfig
from infra.lambdas import ROOT, retention
from infra.nag import acknowledge, logical_id
from infra.queues import QueueWithDlq
from infra.sessions import OpenQueue
from trialbox import aws_retries
from trialbox.constants import (
    ENV_OPEN_QUEUE_URL,
    ENV_POOL_NAME,
    ENV_RECYCLE_AFTER_JOBS,
    ENV_STOP_GRACE_S,
    ENV_WORK_QUEUE_URL,
)
from trialbox.settings import STOP_GRACE_S, STOP_TIMEOUT_S, work_visibility_s

# The worker runs as root and keeps only what its file and process work needs (Fargate can add
# nothing but SYS_PTRACE, so these come from the default set). tests/fargate runs real jobs
# under exactly this set, read from the template, and shows a job failing without each one.
# Nothing here reaches a job: commands start as the slot uid with CapEff 0 and no_new_privs.
KEPT = {
    # Hand the workspace and its files to the slot uid.
    "CHOWN": "chown the slot's workspace and files to its uid",
    # Root materializes, copies (for grading), checkpoints and wipes the slot's 0700 trees,
    # every open relative to a directory fd with O_NOFOLLOW, so a planted link leads nowhere.
    # The alternative, a process per file operation as the slot uid, costs a fork per file
    # and closes no hole that O_NOFOLLOW leaves open.
    "DAC_OVERRIDE": "read and write the slot uid's 0700 workspace",
    # chmod files root handed to the slot uid; remove the slot uid's files from sticky shared
    # directories (/tmp, /dev/shm) in the wipe between jobs.
    "FOWNER": "chmod the slot's files and wipe them from sticky /tmp and /dev/shm",
    # Start each command as the slot uid with no groups; remove SysV IPC and clear keyrings
    # as that uid (no CAP_SYS_ADMIN needed for those).
    "SETUID": "start commands and clean up as the slot uid",
    "SETGID": "start commands as the slot gid with no supplementary groups",
    # Stop and kill the slot uids' processes from root, where they cannot signal back (a kill
    # sent from a child running as the uid could itself be stopped by the uid: red team).
    "KILL": "stop and kill the slot uids' processes from outside",
}
# Writable scratch on a read-only root: the slot state (workspaces, checkpoints) and /tmp.
SCRATCH = {"state": "/var/lib/trialbox", "tmp": "/tmp"}


class Pool(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PoolConfig,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        security_groups: list[ec2.ISecurityGroup],
        heartbeat_s: int,
        environment: dict[str, str],
        log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        # The worker extends a message's visibility on every heartbeat.
        # A job older than the heartbeat has already been given up on and retried.
        self.work = QueueWithDlq(
            self,
            "Work",
            visibility=Duration.seconds(work_visibility_s(heartbeat_s)),
            max_age=Duration.seconds(heartbeat_s),
        )
        self.opens = OpenQueue(self, "Opens")
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=vpc,
            enable_fargate_capacity_providers=True,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Worker",
            cpu=config.cpu,
            memory_limit_mib=config.memory_mb,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        for volume in SCRATCH:
            self.task_definition.add_volume(name=volume)
        log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        image = ecs.ContainerImage.from_asset(
            str(ROOT),
            file="sandbox_image/Dockerfile",
            platform=ecr_assets.Platform.LINUX_ARM64,
            exclude=[".venv", ".git", "cdk.out", "**/__pycache__", ".*_cache", "tests"],
        )
        linux = ecs.LinuxParameters(self, "Linux", init_process_enabled=True)
        dropped = [c for c in ecs.Capability if c is not ecs.Capability.ALL and c.value not in KEPT]
        linux.drop_capabilities(*dropped)
        container = self.task_definition.add_container(
            "worker",
            image=image,
            readonly_root_filesystem=True,
            linux_parameters=linux,
            logging=ecs.LogDriver.aws_logs(stream_prefix="worker", log_group=log_group),
            environment={
                ENV_WORK_QUEUE_URL: self.work.queue.queue_url,
                ENV_OPEN_QUEUE_URL: self.opens.queue.queue_url,
                "TRIALBOX_SANDBOX_BACKEND": "rlimit",
                "TRIALBOX_SANDBOX_STATE_DIR": SCRATCH["state"],
                # Reuse the task for this many jobs, behind the wipe the worker proves between
                # them; it then exits and ECS starts a fresh microVM.
                ENV_RECYCLE_AFTER_JOBS: str(config.recycle_after_jobs),
                # Hand a running job back with time left to answer before the SIGKILL.
                ENV_STOP_GRACE_S: str(STOP_GRACE_S),
                # The HeldSessions metric's Pool dimension (trialbox/worker/metrics.py).
                ENV_POOL_NAME: Stack.of(self).stack_name,
                # Any client the worker's code does not configure retries as its own do.
                **aws_retries.ENVIRONMENT,
                **environment,
            },
            stop_timeout=Duration.seconds(STOP_TIMEOUT_S),
        )
        container.add_mount_points(
            *(
                ecs.MountPoint(container_path=path, source_volume=volume, read_only=False)
                for volume, path in SCRATCH.items()
            )
        )
        # What the worker loop calls, and no more (tests/iam): grant_consume_messages would add
        # GetQueueAttributes and GetQueueUrl, which it never needs (it has the queue's URL).
        for queue in (self.work.queue, self.opens.queue):
            queue.grant(
                self.task_definition.task_role,
                "sqs:ReceiveMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:DeleteMessage",
            )
        self.tasks_arn = Stack.of(self).format_arn(
            service="ecs", resource="task", resource_name=f"{self.cluster.cluster_name}/*"
        )
        # cdk-nag's name for that wildcard (each grant on the pool's tasks acknowledges it).
        self.tasks_finding = (
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:"
            f"<AWS::AccountId>:task/<{logical_id(self.cluster)}>/*]"
        )
        # Scale-in protection while the task hosts a session (trialbox/worker/protection.py):
        # the ECS agent's endpoint calls UpdateTaskProtection with the task role.
        self.task_definition.task_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ecs:UpdateTaskProtection"],
                resources=[self.tasks_arn],
            )
        )
        acknowledge(
            self.task_definition,
            {
                "AwsSolutions-ECS2": "the worker's environment holds resource names only",
                "AwsSolutions-IAM5[Resource::*]": (
                    "ecr:GetAuthorizationToken has no resource-level permissions (image pull)"
                ),
                self.tasks_finding: (
                    "scale-in protection of the pool's own tasks, whose ids ECS assigns"
                ),
            },
        )
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            vpc_subnets=subnets,
            security_groups=security_groups,  # egress: the VPC endpoints only (infra/network.py)
            assign_public_ip=False,
            capacity_provider_strategies=capacity_strategy(config),
            min_healthy_percent=0,
            max_healthy_percent=200,
            # A task that cannot start (image, role, capacity) fails the deploy and rolls it
            # back in minutes, instead of CloudFormation waiting for hours.
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            # No desired_count, on purpose: a DesiredCount in the template is applied again on
            # every update, so an image deploy would drop a busy pool to it mid-training. With
            # none, CloudFormation creates the service with 1 task (which the scaler removes
            # once idle, and which lets the circuit breaker test the image on the first
            # deploy) and leaves the count to the scaler on every update after.
        )
        # The association is created by an aspect of the cluster at synth; without this, the
        # service may be created before FARGATE_SPOT is attached to its cluster and fail.
        Aspects.of(self.cluster).add(
            _DependsOnCapacityProviders(self.service), priority=AspectPriority.DEFAULT + 1
        )
        # The desired count is the scaler's alone (infra/scaler.py): no auto scaling target.


@jsii.implements(IAspect)
class _DependsOnCapacityProviders:
    """Makes the service wait for its cluster's capacity-provider association (an aspect of the
    cluster creates it at synth, after this construct has run)."""

    def __init__(self, service: ecs.FargateService) -> None:
        self.service = service

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, ecs.CfnClusterCapacityProviderAssociations):
            self.service.node.add_dependency(node)


def capacity_strategy(config: PoolConfig) -> list[ecs.CapacityProviderStrategy]:
    """The on-demand base first, then on demand and Spot by their weights (ECS places the base
    before it applies the weights: "CapacityProviderStrategyItem")."""
    if not config.spot:
        return [ecs.CapacityProviderStrategy(capacity_provider="FARGATE", weight=1)]
    strategy = [ecs.CapacityProviderStrategy(capacity_provider="FARGATE_SPOT", weight=1)]
    if config.on_demand_base or config.on_demand_weight:
        on_demand = ecs.CapacityProviderStrategy(
            capacity_provider="FARGATE", base=config.on_demand_base, weight=config.on_demand_weight
        )
        strategy.insert(0, on_demand)
    return strategy
