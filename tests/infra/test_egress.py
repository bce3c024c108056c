"""Sandbox egress is closed: security groups, endpoint policies and the DNS firewall, read from
one shared synth (validator off; cdk-nag on, as on every synth)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template

from tests.support.template import only, resources

HTTPS = {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443}
GATEWAYS = ("s3", "dynamodb")  # the gateway endpoints' services: a managed prefix list each
ECR_LAYERS = "arn:${AWS::Partition}:s3:::prod-${AWS::Region}-starport-layer-bucket/*"
REQUIRED_NAMES = {
    # Fargate's image pull and log driver
    "api.ecr.${AWS::Region}.${AWS::URLSuffix}",
    "${AWS::AccountId}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}",
    "prod-${AWS::Region}-starport-layer-bucket.s3.${AWS::Region}.${AWS::URLSuffix}",
    "prod-${AWS::Region}-starport-layer-bucket.s3.${AWS::URLSuffix}",
    "logs.${AWS::Region}.${AWS::URLSuffix}",
    # the worker's boto3 clients
    "sqs.${AWS::Region}.${AWS::URLSuffix}",
    "states.${AWS::Region}.${AWS::URLSuffix}",
    "s3.${AWS::Region}.${AWS::URLSuffix}",
    "dynamodb.${AWS::Region}.${AWS::URLSuffix}",  # the worker's admission lease
}


def render(value: Any) -> Any:
    """Intrinsics as `${...}` text, so that ARNs and names compare as strings."""
    if isinstance(value, list):
        return [render(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        return f"${{{value['Ref']}}}"
    if set(value) == {"Fn::GetAtt"}:
        return "${" + ".".join(value["Fn::GetAtt"]) + "}"
    if set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return separator.join(str(render(p)) for p in parts)
    if set(value) == {"Fn::Sub"}:
        body = value["Fn::Sub"]
        if isinstance(body, str):
            return body
        text, variables = body
        for name, bound in variables.items():
            text = text.replace(f"${{{name}}}", str(render(bound)))
        return text
    return {k: render(v) for k, v in value.items()}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- the checker, and proof that it can fail ------------------------------------------------------


def too_broad(statement: dict[str, Any]) -> bool:
    """An Allow of every action (`*` or `service:*`) on every resource, with no condition."""
    if statement.get("Effect") != "Allow" or statement.get("Condition"):
        return False
    actions = [str(a) for a in as_list(statement.get("Action", []))]
    every_action = any(a == "*" or a.endswith(":*") for a in actions)
    every_resource = "*" in as_list(statement.get("Resource", []))
    return every_action and every_resource


@pytest.mark.parametrize(
    ("statement", "flagged"),
    [
        ({"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*"}, True),
        ({"Effect": "Allow", "Action": ["s3:GetObject", "s3:*"], "Resource": ["*"]}, True),
        (  # CDK's default endpoint policy is no policy at all; this is what it amounts to
            {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sqs:*", "Resource": "*"},
            True,
        ),
        (
            {
                "Effect": "Allow",
                "Action": "ecr:GetAuthorizationToken",
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:PrincipalAccount": "1"}},
            },
            False,
        ),
        ({"Effect": "Allow", "Action": "sqs:*", "Resource": "arn:aws:sqs:r:1:*"}, False),
        ({"Effect": "Deny", "Action": "*", "Resource": "*"}, False),
    ],
)
def test_the_breadth_checker_flags_star_on_star(statement: dict[str, Any], flagged: bool) -> None:
    assert too_broad(statement) is flagged


# -- security groups ------------------------------------------------------------------------------


def security_group(template: Template, description: str) -> str:
    (logical,) = [
        k
        for k, r in resources(template, "AWS::EC2::SecurityGroup").items()
        if r["Properties"]["GroupDescription"].startswith(description)
    ]
    return logical


def egress_rules(template: Template, group: str) -> list[dict[str, Any]]:
    """Inline rules and standalone AWS::EC2::SecurityGroupEgress resources of one group."""
    inline = resources(template, "AWS::EC2::SecurityGroup")[group]["Properties"]
    rules = list(inline.get("SecurityGroupEgress", []))
    for resource in resources(template, "AWS::EC2::SecurityGroupEgress").values():
        props = resource["Properties"]
        if props["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]}:
            rules.append({k: v for k, v in props.items() if k != "GroupId"})
    return rules


def prefix_list_lookups(template: Template) -> dict[str, str]:
    """The custom resources that read the region's managed prefix list ids at deploy, by the
    gateway's service (s3, dynamodb)."""
    found = {}
    for logical, resource in resources(template, "Custom::AWS").items():
        call = json.loads(render(resource["Properties"]["Update"]))
        if call["action"] == "describeManagedPrefixLists":
            (listed,) = call["parameters"]["Filters"]
            assert listed["Name"] == "prefix-list-name"
            (name,) = listed["Values"]
            service = name.removeprefix("com.amazonaws.${AWS::Region}.")
            assert service not in found
            found[service] = logical
    assert sorted(found) == sorted(GATEWAYS)
    return found


def test_workers_reach_only_the_endpoints_and_the_gateways_prefix_lists_on_443(
    template: Template,
) -> None:
    workers = security_group(template, "Sandbox workers")
    endpoints = security_group(template, "Interface endpoints")
    lookups = prefix_list_lookups(template)
    rules = egress_rules(template, workers)
    for rule in rules:
        assert "CidrIp" not in rule and "CidrIpv6" not in rule, rule  # no 0.0.0.0/0 nor ::/0
        assert {k: rule[k] for k in HTTPS} == HTTPS, rule
    targets = sorted(
        json.dumps(rule.get("DestinationSecurityGroupId") or rule.get("DestinationPrefixListId"))
        for rule in rules
    )
    assert targets == sorted(
        [
            json.dumps({"Fn::GetAtt": [endpoints, "GroupId"]}),
            *(
                json.dumps({"Fn::GetAtt": [lookup, "PrefixLists.0.PrefixListId"]})
                for lookup in lookups.values()
            ),
        ]
    )


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_the_prefix_list_lookup_has_its_own_role_and_logs(template: Template, gateway: str) -> None:
    lookup = prefix_list_lookups(template)[gateway]
    token = resources(template, "Custom::AWS")[lookup]["Properties"]["ServiceToken"]
    provider = resources(template, "AWS::Lambda::Function")[token["Fn::GetAtt"][0]]["Properties"]
    assert "Ref" in provider["LoggingConfig"]["LogGroup"]
    role = resources(template, "AWS::IAM::Role")[provider["Role"]["Fn::GetAtt"][0]]["Properties"]
    assert "ManagedPolicyArns" not in role
    # The only call it makes, and everything its role may do besides writing its own logs.
    actions = {
        json.dumps(s["Action"])
        for p in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": provider["Role"]["Fn::GetAtt"][0]} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    }
    assert actions == {
        json.dumps("ec2:DescribeManagedPrefixLists"),
        json.dumps(["logs:CreateLogStream", "logs:PutLogEvents"]),
    }


def test_the_service_runs_in_the_workers_group_only(template: Template) -> None:
    workers = security_group(template, "Sandbox workers")
    _, service = only(template, "AWS::ECS::Service")
    vpc_config = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert vpc_config["SecurityGroups"] == [{"Fn::GetAtt": [workers, "GroupId"]}]
    assert vpc_config["AssignPublicIp"] == "DISABLED"


def test_interface_endpoints_accept_443_from_the_workers_only(template: Template) -> None:
    workers = security_group(template, "Sandbox workers")
    endpoints = security_group(template, "Interface endpoints")
    group = resources(template, "AWS::EC2::SecurityGroup")[endpoints]["Properties"]
    assert "SecurityGroupIngress" not in group  # no VPC-CIDR rule
    ingress = [
        r["Properties"]
        for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [endpoints, "GroupId"]}
    ]
    assert len(ingress) == 1
    assert ingress[0]["SourceSecurityGroupId"] == {"Fn::GetAtt": [workers, "GroupId"]}
    assert {k: ingress[0][k] for k in HTTPS} == HTTPS
    interface = [
        r["Properties"]
        for r in resources(template, "AWS::EC2::VPCEndpoint").values()
        if r["Properties"].get("VpcEndpointType") == "Interface"
    ]
    assert len(interface) == 5
    for endpoint in interface:
        assert endpoint["SecurityGroupIds"] == [{"Fn::GetAtt": [endpoints, "GroupId"]}]


# -- endpoint policies ----------------------------------------------------------------------------


def endpoint_statements(template: Template) -> dict[str, list[dict[str, Any]]]:
    return {
        render(r["Properties"]["ServiceName"]): r["Properties"]["PolicyDocument"]["Statement"]
        for r in resources(template, "AWS::EC2::VPCEndpoint").values()
    }


def test_every_endpoint_has_a_policy_and_none_allows_everything(template: Template) -> None:
    endpoints = resources(template, "AWS::EC2::VPCEndpoint")
    assert len(endpoints) == 7  # 5 interface, 2 gateway
    for endpoint in endpoints.values():
        statements = endpoint["Properties"]["PolicyDocument"]["Statement"]
        assert statements
        assert [s for s in statements if too_broad(s)] == []


def test_s3_serves_only_the_stack_buckets_and_ecr_layers(template: Template) -> None:
    tasksets, _ = only(template, "AWS::S3::Bucket", "StorageTasksets")
    traces, _ = only(template, "AWS::S3::Bucket", "StorageTraces")
    (s3,) = [v for k, v in endpoint_statements(template).items() if k.endswith(".s3")]
    served = {r for s in s3 for r in as_list(render(s["Resource"]))}
    assert served == {
        f"${{{tasksets}.Arn}}",
        f"${{{tasksets}.Arn}}/*",
        f"${{{traces}.Arn}}",
        f"${{{traces}.Arn}}/*",
        ECR_LAYERS,
    }
    for statement in s3:
        assert statement["Effect"] == "Allow"
        assert not any("*" in a for a in as_list(statement["Action"]))
        if ECR_LAYERS not in as_list(render(statement["Resource"])):
            assert render(statement.get("Condition")) == {
                "StringEquals": {"aws:PrincipalAccount": "${AWS::AccountId}"}
            }


def test_dynamodb_serves_only_the_workers_lease_calls_on_the_admission_table(
    template: Template,
) -> None:
    """A worker's only DynamoDB calls are its admission lease's, its job slot's and a batched
    sample's claim: the gateway serves those, on that table, to this account, and nothing else
    (not the executions table)."""
    admission, _ = only(template, "AWS::DynamoDB::Table", "StorageAdmission")
    (statements,) = [v for k, v in endpoint_statements(template).items() if k.endswith(".dynamodb")]
    (statement,) = statements
    assert statement["Effect"] == "Allow"
    assert sorted(as_list(statement["Action"])) == [
        "dynamodb:DeleteItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
    ]
    assert render(statement["Resource"]) == f"${{{admission}.Arn}}"
    assert render(statement.get("Condition")) == {
        "StringEquals": {"aws:PrincipalAccount": "${AWS::AccountId}"}
    }


@pytest.mark.parametrize(
    ("service", "arn"),
    [
        ("sqs", "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:*"),
        ("states", "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:*"),
        ("ecr.api", "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/*"),
        ("ecr.dkr", "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/*"),
        ("logs", "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:*"),
    ],
)
def test_interface_endpoints_serve_only_this_account(
    template: Template, service: str, arn: str
) -> None:
    (statements,) = [v for k, v in endpoint_statements(template).items() if k.endswith(service)]
    for statement in statements:
        assert statement["Effect"] == "Allow"
        assert statement["Principal"] == {"AWS": "*"}
        assert render(statement.get("Condition")) == {
            "StringEquals": {"aws:PrincipalAccount": "${AWS::AccountId}"}
        }
        resource = render(statement["Resource"])
        if resource == "*":  # only the call that has no resource ARN
            assert statement["Action"] == "ecr:GetAuthorizationToken"
        else:
            assert resource == arn
    granted = {a for s in statements for a in as_list(s["Action"])}
    prefix = service.split(".")[0]  # the IAM prefix: sqs, states, ecr, logs
    extra = {"ecr:GetAuthorizationToken"} if prefix == "ecr" else set()
    assert granted == {f"{prefix}:*"} | extra


# -- DNS firewall ---------------------------------------------------------------------------------


def domain_lists(template: Template) -> dict[str, list[str]]:
    return {
        k: render(r["Properties"]["Domains"])
        for k, r in resources(template, "AWS::Route53Resolver::FirewallDomainList").items()
    }


def test_dns_firewall_allows_the_names_the_task_resolves(template: Template) -> None:
    _, group = only(template, "AWS::Route53Resolver::FirewallRuleGroup")
    lists = domain_lists(template)
    allows = [r for r in group["Properties"]["FirewallRules"] if r["Action"] == "ALLOW"]
    (allow,) = allows
    allowed = lists[allow["FirewallDomainListId"]["Fn::GetAtt"][0]]
    tasksets, _ = only(template, "AWS::S3::Bucket", "StorageTasksets")
    traces, _ = only(template, "AWS::S3::Bucket", "StorageTraces")
    buckets = {
        f"${{{bucket}}}.s3.{where}${{AWS::URLSuffix}}"
        for bucket in (tasksets, traces)
        for where in ("${AWS::Region}.", "")  # regional, and boto3's us-east-1 global form
    }
    assert set(allowed) == REQUIRED_NAMES | buckets
    # Nothing but AWS's own names, and no wildcard that would reach beyond them.
    assert all(name.endswith(".${AWS::URLSuffix}") and "*" not in name for name in allowed)


def test_dns_firewall_blocks_everything_else_last(template: Template) -> None:
    _, group = only(template, "AWS::Route53Resolver::FirewallRuleGroup")
    rules = sorted(group["Properties"]["FirewallRules"], key=lambda r: r["Priority"])
    last = rules[-1]
    assert last["Action"] == "BLOCK"
    assert last["BlockResponse"] in {"NODATA", "NXDOMAIN"}
    assert domain_lists(template)[last["FirewallDomainListId"]["Fn::GetAtt"][0]] == ["*"]
    assert len({r["Priority"] for r in rules}) == len(rules)


def test_dns_firewall_is_associated_with_the_stack_vpc(template: Template) -> None:
    vpc, _ = only(template, "AWS::EC2::VPC")
    group, _ = only(template, "AWS::Route53Resolver::FirewallRuleGroup")
    _, association = only(template, "AWS::Route53Resolver::FirewallRuleGroupAssociation")
    props = association["Properties"]
    assert props["VpcId"] == {"Ref": vpc}
    assert props["FirewallRuleGroupId"] == {"Fn::GetAtt": [group, "Id"]}
    assert 100 < props["Priority"] < 9000
