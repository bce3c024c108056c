"""Each moto patch fails a test if it stops being needed or stops working."""

from __future__ import annotations

import copy
import http.client
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from jsonpath_ng.parser import JsonPathParser
from moto import backends, mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core import responses as moto_responses
from moto.core import utils as moto_utils
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import ThreadedMotoServer
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
    state_task_service_sqs,
)
from moto.stepfunctions.parser.asl.eval.callback.callback import (
    CallbackEndpoint,
    CallbackOutcomeSuccess,
)
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.utils import json_path

from trialbox.local import patches


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    yield
    patches.undo()


def invoke(backend: LambdaSimpleBackend, name: str, body: str) -> tuple[bytes, dict[str, str]]:
    headers: dict[str, str] = {}
    payload = backend.invoke(name, None, body, {}, headers)
    assert isinstance(payload, bytes)
    return payload, headers


def test_moto_lambda_echoes_without_the_patch_and_runs_handlers_with_it() -> None:
    backend = LambdaSimpleBackend("us-east-1", "123456789012")
    assert invoke(backend, "f", '{"x": 1}') == (b'{"x": 1}', {})  # still needed

    calls: list[tuple[str, bytes]] = []

    def host(name: str, payload: bytes) -> tuple[bool, bytes]:
        calls.append((name, payload))
        return name != "broken", b'{"ok": true}'

    patches.route_lambda_invocations(host)
    arn = "arn:aws:lambda:us-east-1:123456789012:function:Prepare:$LATEST"
    assert invoke(backend, arn, "{}") == (b'{"ok": true}', {})
    assert invoke(backend, "broken", "{}")[1] == {"x-amz-function-error": "Unhandled"}
    assert calls == [("Prepare", b"{}"), ("broken", b"{}")]


def early_callback_is_seen(timeout_s: float) -> bool:
    endpoint = CallbackEndpoint("token")
    endpoint.notify(CallbackOutcomeSuccess(callback_id="token", output="{}"))
    heartbeat = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=timeout_s)
    return bool(heartbeat.clear_and_wait())


def test_an_early_callback_is_lost_without_the_patch_and_kept_with_it() -> None:
    assert early_callback_is_seen(0.2) is False  # still needed: moto waits out the heartbeat
    patches.keep_early_callbacks()
    started = time.monotonic()
    assert early_callback_is_seen(5) is True
    assert time.monotonic() - started < 1


def test_an_early_heartbeat_is_refused_without_the_patch_and_accepted_with_it() -> None:
    assert CallbackEndpoint("token").notify_heartbeat() is False  # still needed: InvalidToken
    patches.accept_early_heartbeats()
    endpoint = CallbackEndpoint("token")
    assert endpoint.notify_heartbeat() is True
    heartbeat = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=5)
    assert endpoint.notify_heartbeat() is True  # a later heartbeat still reaches the clock
    assert heartbeat.clear_and_wait() is True


def test_moto_builds_a_client_per_call_without_the_patch_and_reuses_one_with_it() -> None:
    call_sites = (lambda_eval_utils, state_task_service_sqs)  # Lambda invoke, sendMessage
    for site in call_sites:  # still needed: a new client each time
        assert site.boto_client_for("us-east-1", "sqs") is not site.boto_client_for(
            "us-east-1", "sqs"
        )
    patches.reuse_service_clients()
    for site in call_sites:
        one = site.boto_client_for("us-east-1", "lambda")
        assert one is site.boto_client_for("us-east-1", "lambda")
        assert (
            one.meta.region_name == "us-east-1" and one.meta.service_model.service_name == "lambda"
        )
    assert lambda_eval_utils.boto_client_for("us-east-1", "sqs") is not one


WAIT_FOR_TOKEN = {
    "StartAt": "Execute",
    "States": {
        "Execute": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {"QueueUrl": "QUEUE", "MessageBody": {"token.$": "$$.Task.Token"}},
            "End": True,
        }
    },
}


def failure_cause_seen() -> str | None:
    """SendTaskFailure with a cause on a real waitForTaskToken state; the cause the execution
    failed with."""
    config: Any = {"stepfunctions": {"execute_state_machine": True}}
    with mock_aws(config=config):
        sqs, sfn = boto3.client("sqs", "us-east-1"), boto3.client("stepfunctions", "us-east-1")
        queue = sqs.create_queue(QueueName="work")["QueueUrl"]
        definition = json.dumps(WAIT_FOR_TOKEN).replace("QUEUE", queue)
        arn = sfn.create_state_machine(
            name="m", definition=definition, roleArn="arn:aws:iam::123456789012:role/r"
        )["stateMachineArn"]
        execution = sfn.start_execution(stateMachineArn=arn, name="e")["executionArn"]
        messages: list[dict[str, Any]] = []
        while not messages:
            messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1).get("Messages", [])
        token = json.loads(messages[0]["Body"])["token"]
        sfn.send_task_failure(taskToken=token, error="Sandbox.Error", cause="disk full")
        deadline = time.monotonic() + 10
        while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        events = sfn.get_execution_history(executionArn=execution)["events"]
        (failed,) = [
            e["executionFailedEventDetails"] for e in events if e["type"] == "ExecutionFailed"
        ]
        assert failed["error"] == "Sandbox.Error"
        return failed.get("cause")


def test_a_failure_cause_is_dropped_without_the_patch_and_kept_with_it() -> None:
    assert failure_cause_seen() is None  # still needed
    patches.keep_failure_causes()
    assert failure_cause_seen() == "disk full"


CHOOSE = {
    "StartAt": "Choose",
    "States": {
        "Choose": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.n", "NumericGreaterThan": 1, "Next": "Big"}],
            "Default": "Small",
        },
        "Big": {"Type": "Pass", "Result": {"size": "big"}, "End": True},
        "Small": {"Type": "Pass", "Result": {"size": "small"}, "End": True},
    },
}
BRANCHES = {
    "StartAt": "Both",
    "States": {
        "Both": {
            "Type": "Parallel",
            "Branches": [{"StartAt": "One", "States": {"One": {"Type": "Pass", "End": True}}}],
            "End": True,
        }
    },
}


def parses_and_outputs(
    definition: dict[str, Any], inputs: list[int], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[Any]]:
    """Run one execution per input, a few at once; how many times moto parsed a definition
    for an execution, and each execution's output."""
    parsed = []
    real = AmazonStateLanguageParser.parse

    def counted(text: str) -> Any:
        parsed.append(text)
        return real(text)

    config: Any = {"stepfunctions": {"execute_state_machine": True}}
    with mock_aws(config=config):
        sfn = boto3.client("stepfunctions", "us-east-1")
        arn = sfn.create_state_machine(
            name="m", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/r"
        )["stateMachineArn"]
        monkeypatch.setattr(AmazonStateLanguageParser, "parse", staticmethod(counted))
        executions = [
            sfn.start_execution(stateMachineArn=arn, name=f"e{i}", input=json.dumps({"n": n}))[
                "executionArn"
            ]
            for i, n in enumerate(inputs)
        ]
        outputs = []
        for execution in executions:
            deadline = time.monotonic() + 10
            while (answer := sfn.describe_execution(executionArn=execution))["status"] == "RUNNING":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert answer["status"] == "SUCCEEDED", answer
            outputs.append(json.loads(answer["output"]))
        monkeypatch.undo()
    return len(parsed), outputs


def test_moto_parses_a_definition_per_execution_without_the_patch_and_once_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = [0, 5, 2, 1]
    sizes = [{"size": s} for s in ("small", "big", "big", "small")]
    assert parses_and_outputs(CHOOSE, inputs, monkeypatch) == (4, sizes)
    patches.parse_each_definition_once()
    assert parses_and_outputs(CHOOSE, inputs, monkeypatch) == (1, sizes)
    # A Parallel's components hold a run's state: each execution parses its own.
    assert parses_and_outputs(BRANCHES, [0, 1], monkeypatch)[0] == 2


def test_moto_builds_a_json_path_parser_per_evaluation_without_the_patch_and_once_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = []
    real = JsonPathParser.__init__

    def counted(self: JsonPathParser, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(JsonPathParser, "__init__", counted)
    data = {"size": "big", "input": {"value": 3}, "items": [1, 2]}
    paths = ["$.size", "$.input.value", "$.size", "$.items[0]", "$.input.value", "$.size"]
    found = [json_path.extract_json(path, data) for path in paths]
    assert found == ["big", 3, "big", 1, 3, "big"]
    assert len(built) == len(paths)  # still needed: a parser (and its tables) per evaluation
    patches.parse_each_json_path_once()
    built.clear()
    assert [json_path.extract_json(path, data) for path in paths] == found
    assert len(built) == 3  # once for each path
    monkeypatch.undo()
    # Executions evaluate their paths through it (InputPath, ResultPath, parameters) alike.
    sizes = [{"size": s} for s in ("small", "big", "big", "small")]
    assert parses_and_outputs(CHOOSE, [0, 5, 2, 1], monkeypatch)[1] == sizes


def test_the_moto_server_lists_its_package_per_request_without_the_patch_and_once_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = []
    real = backends.list_of_moto_modules

    def counted() -> Any:
        listed.append(1)
        return real()

    monkeypatch.setattr(backends, "list_of_moto_modules", counted)
    app = DomainDispatcherApplication(create_backend_app)
    hosts = ["dynamodb", "sqs", "dynamodb", "s3.amazonaws.com", "sqs", "dynamodb"]
    answers = [app.get_backend_for_host(host) for host in hosts]
    assert len(listed) == len(hosts)  # still needed: a directory listing per request
    patches.route_each_host_once()
    listed.clear()
    assert [app.get_backend_for_host(host) for host in hosts] == answers
    assert answers[:3] == ["dynamodb", "sqs", "dynamodb"] and answers[3] == "s3"
    assert len(listed) == 3  # once for each host


def _admission_race(rounds: int) -> tuple[int, int, int]:
    """Threads admit and release through the admission table's transactions, one of them
    refused each round (its marker exists): the in-flight count and the markers left, which
    must both be 0, and the rounds that went wrong (a release that found nothing to give
    back, an error)."""
    from trialbox.pipeline.admission import Admission

    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    dynamodb.create_table(
        TableName="admission",
        KeySchema=[
            {"AttributeName": "part", "KeyType": "HASH"},
            {"AttributeName": "id", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "part", "AttributeType": "S"},
            {"AttributeName": "id", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    admission = Admission(dynamodb, "admission")
    admission.lease("w", 1000, term_s=600)

    wrong: list[str] = []

    def work(thread: int) -> None:
        for n in range(rounds):
            request_id = f"r-{thread}-{n}"
            try:
                admitted = admission.admit(request_id)
                # A redelivery past its first ask (which reads the marker, and would find
                # it): its transaction is cancelled on the marker's condition.
                admission.admit(request_id, again=True)
                if not (admitted and admission.release(request_id)):
                    wrong.append(request_id)
            except Exception as exc:  # moto's own state, torn mid-iteration
                wrong.append(f"{request_id}: {exc!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        return admission.in_flight(), len(admission.admitted()), len(wrong)
    except Exception as exc:  # the table itself torn (seen: a count item without its count)
        wrong.append(f"reading the table: {exc!r}")
        return -1, -1, len(wrong)


def test_a_cancelled_transaction_undoes_no_other_request_s_writes() -> None:
    with mock_aws():
        torn = _admission_race(rounds=40)
    # Without the patch, releases undone and moto's tables torn (seen: 1 in flight with no
    # marker left, a lost release, "dictionary changed size during iteration", a count item
    # with no count).
    assert torn != (0, 0, 0), "moto's transactions are isolated now: drop the patch"
    patches.isolate_dynamodb_transactions()
    with mock_aws():
        assert _admission_race(rounds=40) == (0, 0, 0)


def _transact(patched: bool) -> tuple[list[str], dict[str, str | None]]:
    """A table of 200 items, one transaction that commits and one cancelled (its update and
    delete applied before its last condition fails): the types moto deep-copied meanwhile,
    and the items the transactions named, afterwards."""
    copied: list[str] = []
    real = copy.deepcopy

    def counted(value: Any, memo: Any = None) -> Any:
        copied.append(type(value).__name__)
        return real(value, memo)

    with mock_aws():
        if patched:
            patches.isolate_dynamodb_transactions()
        db = boto3.client("dynamodb", region_name="us-east-1")
        db.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for n in range(200):
            db.put_item(TableName="t", Item={"k": {"S": f"i{n}"}, "v": {"S": "old"}})
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(copy, "deepcopy", counted)
            db.transact_write_items(
                TransactItems=[{"Put": {"TableName": "t", "Item": {"k": {"S": "new"}}}}]
            )
            update = {
                "TableName": "t",
                "Key": {"k": {"S": "i1"}},
                "UpdateExpression": "SET v = :v",
                "ExpressionAttributeValues": {":v": {"S": "changed"}},
            }
            cancelled = [
                {"Update": update},
                {"Delete": {"TableName": "t", "Key": {"k": {"S": "i2"}}}},
                {"Put": {"TableName": "t", "Item": {"k": {"S": "made"}}}},
                {
                    "ConditionCheck": {
                        "TableName": "t",
                        "Key": {"k": {"S": "i3"}},
                        "ConditionExpression": "attribute_not_exists(k)",
                    }
                },
            ]
            with pytest.raises(db.exceptions.TransactionCanceledException):
                db.transact_write_items(TransactItems=cancelled)
        items = {}
        for key in ("new", "i1", "i2", "made", "i3"):
            found = db.get_item(TableName="t", Key={"k": {"S": key}}).get("Item")
            items[key] = None if found is None else found.get("v", {}).get("S", "")
    return copied, items


def test_moto_copies_a_transactions_whole_table_without_the_patch_and_its_items_with_it() -> None:
    """A transaction's rollback copy costs its own items, not the table's (its cost grew
    with the results table over a run); a cancelled one still undoes all it did."""
    undone = {"new": "", "i1": "old", "i2": "old", "made": None, "i3": "old"}
    copied, items = _transact(patched=False)
    assert "Table" in copied, "moto no longer copies whole tables: drop that part of the patch"
    assert items == undone
    copied, items = _transact(patched=True)
    assert "Table" not in copied and copied.count("Item") <= 6, copied
    assert items == undone


def _clock_reads_per_send(monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    """utcnow calls for one message sent to a queue of 50, and what a receive then gets."""
    reads = []
    real = moto_utils.utcnow

    def counted() -> Any:
        reads.append(1)
        return real()

    monkeypatch.setattr(moto_utils, "utcnow", counted)
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        for n in range(50):
            sqs.send_message(QueueUrl=url, MessageBody=str(n))
        reads.clear()
        sqs.send_message(QueueUrl=url, MessageBody="last")
        sent = len(reads)
        taken = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        later = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        bodies = [m["Body"] for m in taken["Messages"] + again["Messages"] + later["Messages"]]
    return sent, bodies


def test_moto_sqs_asks_datetime_for_every_message_per_send_without_the_patch_and_never_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent, bodies = _clock_reads_per_send(monkeypatch)
    assert sent > 100, "moto's SQS no longer scans the queue per send: drop the patch"
    patches.read_the_sqs_clock_directly()
    sent, patched = _clock_reads_per_send(monkeypatch)
    assert sent == 0
    # Visibility still keeps time: messages received with 0 s come again, with 60 s not.
    assert patched == bodies and patched[:10] == patched[10:20] and patched[20] == "10"


SIGNED = {
    "Content-Type": "application/x-amz-json-1.0",
    "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request"
    ", SignedHeaders=host, Signature=0",
}


def _two_calls_on_one_connection() -> list[tuple[int, bool, bytes]]:
    """A moto server, and on one HTTP/1.1 connection: a request whose body moto never reads
    (an operation it does not know), then ListTables. Each answer's status, whether the
    server said it would close the connection, and its body."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.get_host_and_port()[1])
        answers = []
        for target, body in (("NoSuchOperation", b'{"x": "' + b"y" * 5000 + b'"}'),
                             ("ListTables", b"{}")):  # fmt: skip
            headers = SIGNED | {"X-Amz-Target": f"DynamoDB_20120810.{target}"}
            connection.request("POST", "/", body=body, headers=headers)
            answer = connection.getresponse()
            answers.append((answer.status, answer.will_close, answer.read()))
            if answer.will_close:
                connection.close()  # the next request on a new connection
        return answers
    finally:
        server.stop()


def test_the_moto_server_closes_every_connection_without_the_patch_and_keeps_it_with_it() -> None:
    """Each call of the twin's opened a TCP connection (and a server thread). With the patch
    the connection stays for the next request, and a body moto did not read is not taken for
    the next request's start."""
    closed = _two_calls_on_one_connection()
    assert [will_close for _, will_close, _ in closed] == [True, True]  # still needed
    patches.keep_connections_alive()
    kept = _two_calls_on_one_connection()
    assert [will_close for _, will_close, _ in kept] == [False, False]
    assert [(status, body) for status, _, body in kept] == [
        (status, body) for status, _, body in closed
    ]
    assert kept[1][0] == 200 and json.loads(kept[1][2]) == {"TableNames": []}


@pytest.mark.parametrize("length", ["-1", "abc"])
def test_a_request_whose_length_is_not_one_is_answered_on_a_closed_connection(
    length: str,
) -> None:
    """The patch reads a body of its Content-Length before moto runs; a length that is not a
    number of bytes is left to werkzeug, which answers and closes (the patch read -1 as
    'until the client closes' and never answered)."""
    patches.keep_connections_alive()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.get_host_and_port()[1])) as raw:
            raw.settimeout(10)
            head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
            raw.sendall(head.encode() + b"X-Amz-Target: DynamoDB_20120810.ListTables\r\n\r\n{}")
            answer = raw.recv(65536)
    finally:
        server.stop()
    assert answer.startswith(b"HTTP/1.1 ") and b"Connection: close" in answer, answer[:200]


def test_moto_lists_a_responses_class_per_request_without_the_patch_and_once_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto found a request's action among its responses class's functions listed anew for
    every request (inspect.getmembers); with the patch each class is listed once, and every
    action is still found."""
    listed: list[type] = []
    real = moto_utils.method_names_from_class

    def counted(clazz: type) -> list[str]:
        listed.append(clazz)
        return real(clazz)

    monkeypatch.setitem(vars(moto_responses), "method_names_from_class", counted)
    monkeypatch.setattr(patches, "_original_method_names", counted)

    def calls() -> list[str]:
        with mock_aws():
            dynamodb = boto3.client("dynamodb", region_name="us-east-1")
            tables = [dynamodb.list_tables()["TableNames"] for _ in range(3)]
            sqs = boto3.client("sqs", region_name="us-east-1")
            queues = [sqs.list_queues().get("QueueUrls", []) for _ in range(2)]
        return [str(tables), str(queues)]

    before = calls()
    assert len(listed) == 5  # still needed: a listing per request
    listed.clear()
    patches.find_each_action_by_a_set()
    assert calls() == before
    assert len(set(listed)) == len(listed) == 2  # once for each class


HEADER_BLOCKS = [
    b"Host: x\r\nContent-Length: 2\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\n\r\n",
    b"host:x\r\nA:  spaced  \r\nA: twice\r\nEmpty:\r\n\r\n",  # no space, kept spaces, repeats
    b"Folded: one\r\n two\r\nNext: 3\r\n\r\n",  # a folded line: the email parser's case
    b"No colon here\r\nHost: x\r\n\r\n",  # malformed: the email parser's case
    b"Bare: lf\nOnly: lf\n\n",
    b"Latin: \xe9t\xe9\r\n\r\n",
    b"\r\n",  # no header at all
    b"A: b\rC: d\r\nE: f\r\n\r\n",  # a bare CR: the email parser ends a line there too
    b"A: b\r\r\nC: d\r\n\r\n",
    b"Blank:   \r\nTabbed:\t v \r\n\r\n",
    b"Content-Type: multipart/mixed; boundary=x\r\n\r\n",  # a payload it parses
    b"Content-Type: message/rfc822\r\n\r\n",
]


def _payload(message: Any) -> Any:
    payload = message.get_payload()
    return [part.as_string() for part in payload] if isinstance(payload, list) else payload


@pytest.mark.parametrize("block", HEADER_BLOCKS)
def test_headers_read_directly_are_the_email_parser_s(block: bytes) -> None:
    """http.client read every request's and response's headers with the email package's
    general parser; with the patch, lines of one `name: value` each are read directly and
    the rest still goes to that parser: the message is the same either way."""
    parsed = http.client.parse_headers(io.BytesIO(block + b"body"))
    assert http.client.parse_headers is patches._original_parse_headers  # unpatched
    patches.parse_headers_directly()
    stream = io.BytesIO(block + b"body")
    direct = http.client.parse_headers(stream)
    assert type(direct) is type(parsed) and direct.items() == parsed.items()
    assert direct.get_all("A") == parsed.get_all("A") and stream.read() == b"body"
    assert _payload(direct) == _payload(parsed)
    assert [type(d) for d in direct.defects] == [type(d) for d in parsed.defects]


def test_a_server_with_headers_read_directly_answers_as_before() -> None:
    """Through moto's server and botocore, both reading headers with the patch."""
    patches.parse_headers_directly()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        dynamodb = boto3.client(
            "dynamodb", region_name="us-east-1", endpoint_url=url,
            aws_access_key_id="k", aws_secret_access_key="s",
        )  # fmt: skip
        assert dynamodb.list_tables()["TableNames"] == []
        with pytest.raises(dynamodb.exceptions.ResourceNotFoundException):
            dynamodb.get_item(TableName="none", Key={"k": {"S": "v"}})
    finally:
        server.stop()
