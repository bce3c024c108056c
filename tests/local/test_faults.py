"""The twin's fault injection (trialbox.local.faults): each service answers with its own
throttles and 5xx, as botocore sees and retries them; only the project's principals are
faulted; and a client with the project's retry policy gets through."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer
from typer.testing import CliRunner

from trialbox import aws_retries
from trialbox.cli import app
from trialbox.errors import TrialboxError
from trialbox.local import faults, principals
from trialbox.local.resources import ACCOUNT, REGION
from trialbox.local.twin import LocalTwin

ONE_TRY = Config(retries={"mode": "standard", "total_max_attempts": 1})
QUEUE = "faulted"
BUCKET = "faulted"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Any]]:
    """moto's server, its application wrapped as the twin wraps it; the rate is set per test."""
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    faults.install(moto, 0.0, seed=23)
    endpoint = f"http://127.0.0.1:{moto.get_host_and_port()[1]}"
    client(endpoint, "sqs", principals.SETUP).create_queue(QueueName=QUEUE)
    client(endpoint, "s3", principals.SETUP).create_bucket(Bucket=BUCKET)
    assert moto._server is not None
    yield endpoint, moto._server.app
    moto.stop()


@pytest.fixture
def at(server: tuple[str, Any]) -> Iterator[Callable[[float], str]]:
    """Sets the share of calls faulted; the endpoint."""
    endpoint, middleware = server

    def set_rate(rate: float) -> str:
        middleware.rate = rate
        return endpoint

    yield set_rate
    middleware.rate = 0.0
    middleware.applied = 0.0


def client(endpoint: str, service: str, key: str, config: Config = ONE_TRY) -> Any:
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key,
        aws_secret_access_key="local",
        config=config,
    )


def call(aws: Any) -> Any:
    """One cheap call of the client's service."""
    service = aws.meta.service_model.service_name
    if service == "sqs":
        url = f"{aws.meta.endpoint_url}/{ACCOUNT}/{QUEUE}"
        return aws.send_message(QueueUrl=url, MessageBody="x")
    if service == "s3":
        return aws.put_object(Bucket=BUCKET, Key="k", Body=b"data")
    if service == "dynamodb":
        return aws.list_tables()
    return aws.list_state_machines()


def errors(endpoint: str, service: str, key: str, calls: int) -> set[tuple[str, int]]:
    """The (code, HTTP status) of each error botocore raised over `calls` one-try calls."""
    seen: set[tuple[str, int]] = set()
    aws = client(endpoint, service, key)
    for _ in range(calls):
        with pytest.raises(ClientError) as raised:
            if service == "sqs":
                aws.list_queues()
            elif service == "s3":
                aws.list_objects_v2(Bucket=BUCKET)
            elif service == "dynamodb":
                aws.list_tables()
            else:
                aws.list_state_machines()
        response = raised.value.response
        seen.add((response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]))
    return seen


SERVICES = {"stepfunctions": "states", "sqs": "sqs", "dynamodb": "dynamodb", "s3": "s3"}


@pytest.mark.parametrize("service", SERVICES)
def test_every_call_of_the_projects_principals_gets_its_services_errors_at_share_1(
    at: Callable[[float], str], service: str
) -> None:
    endpoint = at(1.0)
    throttles, failures = faults.FAULTS[SERVICES[service]]
    expected = {(f.code, f.status) for f in throttles + failures}
    for key in (principals.SDK, principals.WORKER, principals.function("Dispatcher")):
        assert errors(endpoint, service, key, calls=40) == expected


@pytest.mark.parametrize("service", SERVICES)
def test_botocores_standard_mode_retries_every_injected_error(
    at: Callable[[float], str], service: str
) -> None:
    """Each code and status is one botocore retries: three attempts where it allows three."""
    endpoint = at(1.0)
    three = Config(retries={"mode": "standard", "total_max_attempts": 3})
    aws = client(endpoint, service, principals.SDK, three)
    listing = {
        "stepfunctions": "list_state_machines",
        "sqs": "list_queues",
        "dynamodb": "list_tables",
        "s3": "list_buckets",
    }[service]
    for _ in range(3):
        with pytest.raises(ClientError) as raised:
            getattr(aws, listing)()
        assert raised.value.response["ResponseMetadata"]["RetryAttempts"] == 2


def test_a_head_request_is_answered_without_a_body(at: Callable[[float], str]) -> None:
    endpoint = at(1.0)
    with pytest.raises(ClientError) as raised:
        client(endpoint, "s3", principals.WORKER).head_object(Bucket=BUCKET, Key="k")
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503)


def test_sqs_query_protocol_errors_are_xml(at: Callable[[float], str]) -> None:
    """Older SQS clients speak the query protocol: a form in, an ErrorResponse out."""
    endpoint = at(1.0)
    credential = f"Credential={principals.SDK}/20260101/{REGION}/sqs/aws4_request"
    answer = requests.post(
        endpoint,
        data={"Action": "ListQueues", "Version": "2012-11-05"},
        headers={"Authorization": f"AWS4-HMAC-SHA256 {credential}, SignedHeaders=host"},
        timeout=10,
    )
    throttles, failures = faults.FAULTS["sqs"]
    codes = {f.code: f.status for f in throttles + failures}
    assert answer.text.startswith('<?xml version="1.0"?><ErrorResponse><Error>')
    code = answer.text.split("<Code>")[1].split("</Code>")[0]
    assert codes[code] == answer.status_code


@pytest.mark.parametrize("service", SERVICES)
def test_state_machines_and_setup_are_never_faulted(
    at: Callable[[float], str], service: str
) -> None:
    endpoint = at(1.0)
    for key in (principals.STATE_MACHINES, principals.SETUP):
        aws = client(endpoint, service, key)
        for _ in range(10):
            assert call(aws)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_an_applied_5xx_did_the_work_and_a_throttle_did_not(
    server: tuple[str, Any], at: Callable[[float], str]
) -> None:
    endpoint, middleware = server
    setup = client(endpoint, "sqs", principals.SETUP)
    url = setup.create_queue(QueueName="applied")["QueueUrl"]
    at(1.0)
    middleware.applied = 1.0
    sqs = client(endpoint, "sqs", principals.SDK)
    statuses = []
    for i in range(30):
        with pytest.raises(ClientError) as raised:
            sqs.send_message(QueueUrl=url, MessageBody=str(i))
        statuses.append(raised.value.response["ResponseMetadata"]["HTTPStatusCode"])
    attributes = setup.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert 0 < statuses.count(400) < 30  # throttles, and 5xx
    assert int(attributes["ApproximateNumberOfMessages"]) == 30 - statuses.count(400)


def test_motos_own_api_is_never_faulted(at: Callable[[float], str]) -> None:
    endpoint = at(1.0)
    for _ in range(10):
        assert requests.get(f"{endpoint}/moto-api/data.json", timeout=10).status_code == 200


@pytest.mark.parametrize("service", SERVICES)
def test_share_0_faults_nothing(at: Callable[[float], str], service: str) -> None:
    aws = client(at(0.0), service, principals.SDK)
    for _ in range(30):
        assert call(aws)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_the_projects_retry_policy_gets_every_call_through_at_a_tenth(
    at: Callable[[float], str],
) -> None:
    endpoint = at(0.1)
    retried = 0
    for service in SERVICES:
        aws = client(endpoint, service, principals.WORKER, aws_retries.config())
        for _ in range(75):
            answer = call(aws)
            assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
            retried += answer["ResponseMetadata"]["RetryAttempts"]
    assert 10 <= retried <= 80  # about 0.1 x 300 x (1 + 0.1 + ...): faults did happen


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_share_outside_0_to_1_is_refused_before_the_twin_starts(share: float) -> None:
    with pytest.raises(TrialboxError, match="faults must be a share of calls between 0 and 1"):
        LocalTwin(faults=share)
    with pytest.raises(TrialboxError, match="faults must be a share of calls between 0 and 1"):
        LocalTwin(faults=0.1, faults_applied=share)


def test_local_up_refuses_faults_outside_0_to_1() -> None:
    result = CliRunner().invoke(app, ["local", "up", "--faults", "1.5"])
    assert result.exit_code == 2
    assert "error: --faults: faults must be a share of calls between 0 and 1" in result.output
    assert "not 1.5" in result.output


def test_a_quota_scaled_down_throttles_its_operation_past_the_bucket(
    server: tuple[str, Any],
) -> None:
    """`LocalTwin(quotas=...)`: the project's calls of one operation past its token bucket
    are throttled as SQS throttles them; other operations, and calls not the project's, pass."""
    endpoint, middleware = server
    middleware.quotas = {"sqs:SendMessage": faults.RateQuota(per_s=0.001, bucket=2.0)}
    try:
        sdk = client(endpoint, "sqs", principals.SDK)
        url = f"{endpoint}/{ACCOUNT}/{QUEUE}"
        sdk.send_message(QueueUrl=url, MessageBody="1")
        sdk.send_message(QueueUrl=url, MessageBody="2")
        with pytest.raises(ClientError) as raised:
            sdk.send_message(QueueUrl=url, MessageBody="3")
        assert raised.value.response["Error"]["Code"] == "RequestThrottled"
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        sdk.get_queue_url(QueueName=QUEUE)  # another operation: no quota
        client(endpoint, "sqs", principals.SETUP).send_message(QueueUrl=url, MessageBody="4")
    finally:
        middleware.quotas = {}
