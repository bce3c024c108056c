"""An isolated VPC: no internet gateway, no NAT. Workers reach AWS through VPC endpoints only.

Sandboxed code shares the worker's network, so the network is what closes its egress:
- security groups: the workers reach only the interface endpoints' group and the S3 and
  DynamoDB gateways' prefix lists, all on 443; the endpoints accept 443 from the workers only;
- endpoint policies: S3 serves only the stack's buckets and ECR's layer bucket; DynamoDB only
  the worker's calls on the admission table (its lease, its job's slot); SQS, Step Functions,
  ECR and Logs serve only this account's principals on this account's resources;
- a DNS firewall (`infra/dns_firewall.py`): only the names the task resolves, NODATA for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra.dns_firewall import DnsFirewall, ecr_layer_bucket_objects
from infra.lambdas import retention
from infra.nag import acknowledge

INTERFACE_ENDPOINTS = {
    "Sqs": ec2.InterfaceVpcEndpointAwsService.SQS,
    "StepFunctions": ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
}
# The resource ARN pattern each interface endpoint serves: this account's, in this region.
ACCOUNT_RESOURCES = {
    "Sqs": ("sqs", "*"),
    "StepFunctions": ("states", "*"),
    "EcrApi": ("ecr", "repository/*"),
    "EcrDocker": ("ecr", "repository/*"),
    "Logs": ("logs", "*"),
}
HTTPS = ec2.Port.tcp(443)
# The pool's subnets: one a zone, in 3 zones, each a /20 (4,091 usable addresses: AWS keeps
# 5). A task takes one (its ENI), an interface endpoint one a subnet: 3 x (4,091 - 5) holds
# the 5,000 tasks a service runs at most (docs/scaling.md; tests/infra/test_deploy.py).
AZS = 3
SUBNET_MASK = 20
# A worker's only DynamoDB calls, on the admission table: its lease (trialbox.worker.lease),
# and its job's slot, marked taken and given back (trialbox.worker.loop).
# Its lease (Put, Delete), its slot (Update), and a batched sample's claim (Get, Update).
WORKER_TABLE_ACTIONS = (
    "dynamodb:PutItem",
    "dynamodb:DeleteItem",
    "dynamodb:UpdateItem",
    "dynamodb:GetItem",
)


def this_account() -> dict[str, dict[str, str]]:
    return {"StringEquals": {"aws:PrincipalAccount": Aws.ACCOUNT_ID}}


class Network(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        buckets: Sequence[s3.IBucket],
        admission: dynamodb.ITable,
        log_retention_days: int,
    ) -> None:
        """`buckets`: the only buckets the S3 gateway serves, besides ECR's layer bucket;
        `admission`: the only table the DynamoDB gateway serves (the workers' leases)."""
        super().__init__(scope, construct_id)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=AZS,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="sandboxes",
                    subnet_type=ec2.SubnetType.PRIVATE_ISOLATED,
                    cidr_mask=SUBNET_MASK,
                )
            ],
            flow_logs={"all": ec2.FlowLogOptions(traffic_type=ec2.FlowLogTrafficType.ALL)},
        )
        self.subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
        self.endpoints_sg = ec2.SecurityGroup(
            self,
            "EndpointsSg",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Interface endpoints: 443 from the sandbox workers only",
        )
        self.workers_sg = ec2.SecurityGroup(
            self,
            "WorkersSg",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Sandbox workers: 443 to the endpoints and the S3 and DynamoDB gateways",
        )
        self.workers_sg.connections.allow_to(
            self.endpoints_sg, HTTPS, "workers to the interface endpoints"
        )
        self.s3 = self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        self._scope_s3(buckets)
        self.dynamodb = self.vpc.add_gateway_endpoint(
            "DynamoDb", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB
        )
        self.dynamodb.add_to_policy(
            iam.PolicyStatement(
                sid="AdmissionLeases",
                principals=[iam.AnyPrincipal()],
                actions=list(WORKER_TABLE_ACTIONS),
                resources=[admission.table_arn],
                conditions=this_account(),
            )
        )
        for name, gateway in (("S3PrefixList", "s3"), ("DynamoDbPrefixList", "dynamodb")):
            prefix_list = GatewayPrefixList(self, name, gateway, log_retention_days)
            self.workers_sg.add_egress_rule(
                ec2.Peer.prefix_list(prefix_list.prefix_list_id),
                HTTPS,
                f"workers to {gateway}, through its gateway endpoint",
            )
        self.endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name,
                service=service,
                private_dns_enabled=True,
                security_groups=[self.endpoints_sg],
                open=False,  # not the VPC CIDR: the workers' group only (above)
            )
            self._scope_to_account(endpoint, *ACCOUNT_RESOURCES[name])
            self.endpoints[name] = endpoint
        self.dns_firewall = DnsFirewall(self, "DnsFirewall", vpc=self.vpc, buckets=buckets)

    def _scope_s3(self, buckets: Sequence[s3.IBucket]) -> None:
        self.s3.add_to_policy(
            iam.PolicyStatement(
                sid="StackBuckets",
                principals=[iam.AnyPrincipal()],
                actions=[
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListBucket",
                ],
                resources=[arn for b in buckets for arn in (b.bucket_arn, b.arn_for_objects("*"))],
                conditions=this_account(),
            )
        )
        # Fargate pulls image layers from ECR's own bucket, through presigned URLs that ECR
        # signs (not this account): no principal condition.
        self.s3.add_to_policy(
            iam.PolicyStatement(
                sid="EcrImageLayers",
                principals=[iam.AnyPrincipal()],
                actions=["s3:GetObject"],
                resources=[ecr_layer_bucket_objects()],
            )
        )

    @staticmethod
    def _scope_to_account(endpoint: ec2.InterfaceVpcEndpoint, service: str, pattern: str) -> None:
        arn = Stack.of(endpoint).format_arn(service=service, resource=pattern)
        endpoint.add_to_policy(
            iam.PolicyStatement(
                sid="ThisAccount",
                principals=[iam.AnyPrincipal()],
                actions=[f"{service}:*"],
                resources=[arn],
                conditions=this_account(),
            )
        )
        if service == "ecr":
            # GetAuthorizationToken has no resource ARN (the image pull's first call).
            endpoint.add_to_policy(
                iam.PolicyStatement(
                    sid="AuthorizationToken",
                    principals=[iam.AnyPrincipal()],
                    actions=["ecr:GetAuthorizationToken"],
                    resources=["*"],
                    conditions=this_account(),
                )
            )


class GatewayPrefixList(Construct):
    """The id of the region's `com.amazonaws.<region>.<service>` managed prefix list (a gateway
    endpoint's: s3, dynamodb), read at deploy.

    CloudFormation has no native way to name an AWS-managed prefix list (the gateway endpoint
    does not return it), and a synth-time lookup would tie the template to one account and
    region. So one DescribeManagedPrefixLists call runs at deploy, in CDK's AwsCustomResource.
    """

    def __init__(
        self, scope: Construct, construct_id: str, service: str, log_retention_days: int
    ) -> None:
        super().__init__(scope, construct_id)
        field = "PrefixLists.0.PrefixListId"
        log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        # A role of its own: its log group and the one call, no managed policy.
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        log_group.grant_write(role)
        lookup = cr.AwsCustomResource(
            self,
            "Lookup",
            on_update=cr.AwsSdkCall(  # also the create call
                service="EC2",
                action="describeManagedPrefixLists",
                parameters={
                    "Filters": [
                        {
                            "Name": "prefix-list-name",
                            "Values": [f"com.amazonaws.{Aws.REGION}.{service}"],
                        }
                    ]
                },
                physical_resource_id=cr.PhysicalResourceId.from_response(field),
                output_paths=[field],
            ),
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(
                resources=cr.AwsCustomResourcePolicy.ANY_RESOURCE
            ),
            install_latest_aws_sdk=False,  # the runtime's SDK has the call; no npm at deploy
            log_group=log_group,
            role=role,
        )
        acknowledge(
            lookup,
            {
                "AwsSolutions-IAM5[Resource::*]": (
                    "ec2:DescribeManagedPrefixLists has no resource-level permissions"
                )
            },
        )
        self.prefix_list_id = lookup.get_response_field(field)
