"""A Route 53 Resolver DNS Firewall on the sandbox VPC: the names the task resolves, nothing else.

Why: with no route out, DNS is what is left. The VPC resolver recurses to any authoritative
server, so a sandboxed process could tunnel data out in the names it asks for. Only AWS's own
names are allowed (their answers come from AWS's servers); any other query gets NODATA.

The names, all in `Fn::Sub` form:
- Fargate's own image pull and log driver, which go through the task's ENI (platform 1.4+):
  ECR api, ECR dkr (this account's registry), ECR's layer bucket, Logs;
- the worker's boto3 calls: SQS, Step Functions, DynamoDB (its admission lease), and S3 for the
  stack's buckets, by the names
  botocore addresses them (virtual-hosted `<bucket>.s3.<region>`; in us-east-1 the legacy
  global `<bucket>.s3.amazonaws.com`) plus the regional path-style host.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_route53resolver as resolver
from aws_cdk import aws_s3 as s3
from constructs import Construct

DOMAIN = "${AWS::URLSuffix}"
ECR_LAYER_BUCKET = "prod-${AWS::Region}-starport-layer-bucket"
# Fargate itself (image pull, awslogs) and the worker's clients, whatever the buckets.
SERVICE_NAMES = (
    f"api.ecr.${{AWS::Region}}.{DOMAIN}",
    f"${{AWS::AccountId}}.dkr.ecr.${{AWS::Region}}.{DOMAIN}",
    f"{ECR_LAYER_BUCKET}.s3.${{AWS::Region}}.{DOMAIN}",
    f"{ECR_LAYER_BUCKET}.s3.{DOMAIN}",  # the layer bucket's global (us-east-1) form
    f"logs.${{AWS::Region}}.{DOMAIN}",
    f"sqs.${{AWS::Region}}.{DOMAIN}",
    f"states.${{AWS::Region}}.{DOMAIN}",
    f"dynamodb.${{AWS::Region}}.{DOMAIN}",
    f"s3.${{AWS::Region}}.{DOMAIN}",
)
# Each stack bucket's virtual-hosted names: regional, and boto3's us-east-1 (global) form.
BUCKET_NAMES = (f"${{Bucket}}.s3.${{AWS::Region}}.{DOMAIN}", f"${{Bucket}}.s3.{DOMAIN}")
ALLOW_PRIORITY, BLOCK_PRIORITY = 100, 200
ASSOCIATION_PRIORITY = 101  # rule groups on a VPC take 101..8999


def ecr_layer_bucket_objects() -> str:
    """The ARN of ECR's layer bucket's objects, for the S3 gateway's policy."""
    return Fn.sub(f"arn:${{AWS::Partition}}:s3:::{ECR_LAYER_BUCKET}/*")


class DnsFirewall(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, buckets: Sequence[s3.IBucket]
    ) -> None:
        super().__init__(scope, construct_id)
        allowed = [Fn.sub(name) for name in SERVICE_NAMES] + [
            Fn.sub(name, {"Bucket": bucket.bucket_name})
            for bucket in buckets
            for name in BUCKET_NAMES
        ]
        self.allowed = resolver.CfnFirewallDomainList(self, "Allowed", domains=allowed)
        self.everything = resolver.CfnFirewallDomainList(self, "Everything", domains=["*"])
        self.rule_group = resolver.CfnFirewallRuleGroup(
            self,
            "Rules",
            firewall_rules=[
                resolver.CfnFirewallRuleGroup.FirewallRuleProperty(
                    action="ALLOW",
                    priority=ALLOW_PRIORITY,
                    firewall_domain_list_id=self.allowed.attr_id,
                    # AWS names answer through CNAMEs (S3: <bucket>.s3... -> s3-r-w...) that
                    # AWS controls: judge the name asked for, not each hop.
                    firewall_domain_redirection_action="TRUST_REDIRECTION_DOMAIN",
                ),
                resolver.CfnFirewallRuleGroup.FirewallRuleProperty(
                    action="BLOCK",
                    priority=BLOCK_PRIORITY,
                    firewall_domain_list_id=self.everything.attr_id,
                    block_response="NODATA",
                ),
            ],
        )
        self.association = resolver.CfnFirewallRuleGroupAssociation(
            self,
            "Association",
            firewall_rule_group_id=self.rule_group.attr_id,
            vpc_id=vpc.vpc_id,
            priority=ASSOCIATION_PRIORITY,
            # Enabled, it would also stop CloudFormation from updating or deleting it.
            mutation_protection="DISABLED",
        )
