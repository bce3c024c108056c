"""The trainer adapters' tools under moto in-process, on sessions served by an echo worker
(tests/support/echo_sessions.py): whatever arguments the model writes (a NUL byte, a lone
surrogate, 200 KB, a wrong type, no object at all), a tool call returns an error text the
model reads, never raises, and sends nothing; the episode goes on."""

from __future__ import annotations

import asyncio
import re
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e import verl_signatures
from tests.support.echo_sessions import EchoSessions
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK
from trialbox import constants as c
from trialbox.errors import InputError, SessionError
from trialbox.integrations import common, verl
from trialbox.integrations.trl import environment_factory
from trialbox.models import Limits, Status, Task
from trialbox.models.sessions import Call, Reply, SessionOpen, SessionSpec
from trialbox.sdk import Client, Resources, sessions
from trialbox.sdk.extract import fenced_blocks

# What a model may put in a tool's argument: none of it can run, all of it is the model's.
BAD_ARGUMENTS = {
    "nul": ("echo a\x00b", "NUL"),
    "lone_surrogate": ("echo \ud800", "not valid Unicode"),
    "200_kb": ("echo " + "x" * 200_000, "bytes"),
    "int": (5, "a string"),
    "none": (None, "a string"),
    "list": (["ls", "-l"], "a string"),
    "dict": ({"command": "ls"}, "a string"),
}


@pytest.fixture(autouse=True)
def short_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's reply queue is read without a long poll: moto serves one call at a time,
    and a 2 s poll would hold up the echo worker."""
    monkeypatch.setattr(sessions, "REPLY_WAIT_S", 0)
    monkeypatch.setattr(sessions, "RECEIVE_WAIT_S", 0)


@pytest.fixture
def sessions_resources(aws: Aws, resources: Resources) -> Resources:
    return Resources(
        requests_queue_url=resources.requests_queue_url,
        executions_table=resources.executions_table,
        traces_bucket=resources.traces_bucket,
        tasksets_bucket=resources.tasksets_bucket,
        open_queue_url=aws.work_queue,  # any queue: the echo worker reads opens there
        session_queue_prefix="trialbox-session-",
    )


@pytest.fixture
def echo(aws: Aws) -> Iterator[EchoSessions]:
    worker = EchoSessions(aws.sqs, aws.work_queue)
    yield worker
    worker.stop()


@pytest.fixture
def env(
    sessions_resources: Resources, echo: EchoSessions, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The TRIALBOX_* environment verl's and SkyRL's adapters connect by; their clients closed
    after the test, while the echo worker still answers."""
    r = sessions_resources
    for name, value in {
        c.ENV_REQUESTS_QUEUE_URL: r.requests_queue_url,
        c.ENV_EXECUTIONS_TABLE: r.executions_table,
        c.ENV_TRACES_BUCKET: r.traces_bucket,
        c.ENV_TASKSETS_BUCKET: r.tasksets_bucket,
        c.ENV_OPEN_QUEUE_URL: r.open_queue_url or "",
        c.ENV_SESSION_QUEUE_PREFIX: r.session_queue_prefix or "",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(c.ENV_STACK, raising=False)
    monkeypatch.delenv(c.ENV_ENDPOINT_URL, raising=False)
    yield
    with common._lock:
        made = list(common._clients.items())
        common._clients.clear()
    for _, client in made:
        client.close()


@pytest.fixture
def client(sessions_resources: Resources, echo: EchoSessions) -> Iterator[Client]:
    with Client(sessions_resources) as made:
        yield made


def test_the_echo_worker_says_alive_before_a_result_as_a_host_does(
    aws: Aws, echo: EchoSessions
) -> None:
    """Was a flake of a loaded suite (an extra call echoed): the echo worker sent a call's
    result and nothing before it, so a client that heard nothing for FAILOVER_S took it for
    lost, reopened the session and sent the call again. As trialbox/worker/sessions.py, it
    says `alive` on a call's receipt (and every ALIVE_S while it runs)."""
    replies = aws.sqs.create_queue(QueueName=f"echo-replies-{uuid.uuid4().hex}")["QueueUrl"]
    spec = SessionSpec(
        session_id="s-1", task_id="add", limits=Limits(), expires_at=time.time() + 60,
        idle_release_s=60, reply_url=replies,
    )  # fmt: skip
    aws.sqs.send_message(
        QueueUrl=aws.work_queue, MessageBody=SessionOpen(session=spec).model_dump_json()
    )
    (opened,) = _replies(aws, replies, 1)
    assert opened.kind == "opened" and opened.inbox_url is not None
    call = Call(session_id="s-1", reply_url=replies, seq=1, op="exec", commands=[["true"]])
    aws.sqs.send_message(QueueUrl=opened.inbox_url, MessageBody=call.model_dump_json())
    told = [(reply.kind, reply.seq, reply.epoch) for reply in _replies(aws, replies, 2)]
    assert told == [("alive", 1, 0), ("result", 1, 0)]


def _replies(aws: Aws, url: str, count: int) -> list[Reply]:
    """The first `count` replies on a reply queue, in the order they came (within 10 s)."""
    got: list[Reply] = []
    deadline = time.monotonic() + 10
    while len(got) < count:
        assert time.monotonic() < deadline, got
        for message in aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            got.append(Reply.model_validate_json(message["Body"]))
            aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        time.sleep(0.01)
    return got


# --- TRL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["bash", "run_python"])
def test_trl_tools_answer_bad_arguments_with_an_error_text_and_the_episode_goes_on(
    env: None, client: Client, echo: EchoSessions, tool: str
) -> None:
    environment = environment_factory(client, task_column="task")()
    environment.reset(task=ADD_TASK)
    parameter = "command" if tool == "bash" else "code"
    for argument, (value, says) in BAD_ARGUMENTS.items():
        answer = getattr(environment, tool)(**{parameter: value})
        assert isinstance(answer, str)
        assert answer.startswith(f"error: the `{parameter}` argument cannot run:"), argument
        assert says in answer, (argument, answer)
        assert len(answer) < 500  # the reason, never the argument echoed back
    program = "bash" if tool == "bash" else "python"
    assert getattr(environment, tool)(**{parameter: "true"}) == f"ran ['{program}', '-c', 'true']"
    assert [call.commands for call in echo.calls] == [[[program, "-c", "true"]]]


def test_trl_a_tool_call_after_the_session_expired_is_an_error_text(
    env: None, client: Client, echo: EchoSessions
) -> None:
    """Was a break: a SessionError (`expired (its TTL passed)`) raised out of `bash()`."""
    # Room for the first call on a loaded machine (at 1 s, a fresh `make test` saw it expire).
    environment = environment_factory(client, task_column="task", ttl_s=5)()
    environment.reset(task=ADD_TASK)
    assert environment.bash(command="true") == "ran ['bash', '-c', 'true']"
    time.sleep(5.2)
    answer = environment.bash(command="true")
    assert re.fullmatch(r"error: session \w+ expired \(its TTL passed\)", answer), answer


# --- verl ----------------------------------------------------------------------------------


@pytest.fixture
def verl_tool(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, module in verl_signatures.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "trialbox.integrations.verl_tool", raising=False)
    from trialbox.integrations.verl_tool import TrialboxTool

    return TrialboxTool


def test_verl_tool_answers_bad_arguments_with_an_error_text_and_the_episode_goes_on(
    env: None, echo: EchoSessions, verl_tool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verl, "_episodes", {})  # the client's close ends the session
    agent_data = types.SimpleNamespace(request_id="episode-1", extra_fields={})
    bad = [{"command": v} for v, _ in BAD_ARGUMENTS.values()] + [None, ["ls"], "ls", {}]

    async def call(arguments: Any) -> tuple[str, float, dict[str, Any]]:
        # tool_agent_loop._call_tool: a new instance id, one execute, a release, per call.
        tool = verl_tool(config={"type": "native"}, tool_schema=None)
        instance_id, _ = await tool.create(create_kwargs={"task": ADD_TASK})
        try:
            response, reward, metrics = await tool.execute(
                instance_id, arguments, agent_data=agent_data
            )
        finally:
            await tool.release(instance_id)
        return str(response.text), reward, metrics

    async def episode() -> tuple[list[Any], Any]:
        return [await call(arguments) for arguments in bad], await call({"command": "true"})

    answers, good = asyncio.run(episode())
    for arguments, (text, reward, metrics) in zip(bad, answers, strict=True):
        assert text.startswith("error: the `command` argument"), (arguments, text)
        assert (reward, metrics) == (0.0, {})
    assert good == ("ran ['bash', '-c', 'true']", 0.0, {"status": "succeeded"})
    assert [call.commands for call in echo.calls if call.op == "exec"] == [[["bash", "-c", "true"]]]


def test_trl_a_closed_client_is_never_reused_by_a_reward(
    env: None, sessions_resources: Resources
) -> None:
    """Was a break: the first live Client given to an adapter was kept for the process;
    once its owner closed it, a fresh Client on the same deployment was ignored and every
    reward was None ("the client is closed"), with only a log warning."""
    from trialbox.integrations.trl import TrialboxReward

    first = Client(sessions_resources)
    TrialboxReward(first, task_column="task")
    first.close()
    assert first.closed
    with Client(sessions_resources) as second:
        reward = TrialboxReward(second, task_column="task")
        assert reward(prompts=["p"], completions=["no code here"], task=[ADD_TASK]) == [0.0]
        assert reward.connection.client() is second
    assert second.closed  # and its owner closed it too: the next call connects afresh
    assert reward(prompts=["p"], completions=["no code"], task=[ADD_TASK]) == [0.0]
    assert reward.connection.client() is not second


def test_a_trainers_settings_are_read_when_the_adapter_is_built(verl_tool: Any) -> None:
    """Was a break: ttl_s=nan (or over a day) made every tool call raise SessionError, and
    command_timeout_s=-5 made every tool call answer the MODEL "error: timeout_s: ...": a
    trainer's setting blamed on the policy. TrialboxTool(ttl_s="x") raised a raw
    ValueError, SkyRL's max_turns=inf a raw OverflowError."""
    from trialbox.integrations.skyrl import TrialboxTextEnv
    from trialbox.integrations.trl import TrialboxReward

    builds: dict[str, Callable[[], object]] = {
        "trl_ttl_nan": lambda: environment_factory("stack", ttl_s=float("nan")),
        "trl_ttl_over_a_day": lambda: environment_factory("stack", ttl_s=86_401),
        "trl_timeout_negative": lambda: environment_factory("stack", command_timeout_s=-5),
        "trl_timeout_text": lambda: environment_factory(
            "stack",
            command_timeout_s="x",  # type: ignore[arg-type]
        ),
        "reward_timeout": lambda: TrialboxReward("stack", timeout=float("inf")),
        "verl_ttl_text": lambda: verl_tool(config={"type": "native", "ttl_s": "x"}),
        "verl_timeout": lambda: verl_tool(config={"type": "native", "command_timeout_s": -1}),
        "skyrl_turns_inf": lambda: TrialboxTextEnv(
            {"stack": "s", "max_turns": float("inf")}, {"task_ref": ADD_TASK}
        ),
        "skyrl_ttl_nan": lambda: TrialboxTextEnv(
            {"stack": "s", "ttl_s": float("nan")}, {"task_ref": ADD_TASK}
        ),
    }
    refused = {}
    for name, build in builds.items():
        with pytest.raises(InputError) as caught:
            build()
        refused[name] = str(caught.value)
    assert refused == {
        "trl_ttl_nan": "ttl_s: Input should be a finite number",
        "trl_ttl_over_a_day": "ttl_s: Input should be less than or equal to 86400",
        "trl_timeout_negative": "command_timeout_s: Input should be greater than 0",
        "trl_timeout_text": "command_timeout_s: Input should be a valid number, unable to parse "
        "string as a number",
        "reward_timeout": "timeout: Input should be a finite number",
        "verl_ttl_text": "config.ttl_s: Input should be a valid number, unable to parse string "
        "as a number",
        "verl_timeout": "config.command_timeout_s: Input should be greater than 0",
        "skyrl_turns_inf": "env_config.max_turns: Input should be a valid integer",
        "skyrl_ttl_nan": "env_config.ttl_s: Input should be a finite number",
    }


# --- SkyRL ---------------------------------------------------------------------------------
# --- SkyRL ---------------------------------------------------------------------------------


def test_skyrl_a_bash_block_that_cannot_run_is_an_observation_not_a_crash(
    env: None, echo: EchoSessions
) -> None:
    from trialbox.integrations.skyrl import TrialboxTextEnv

    environment = TrialboxTextEnv({"max_turns": 4}, {"task_ref": ADD_TASK})
    environment.init([])
    try:
        for argument in ("lone_surrogate", "200_kb"):  # a NUL is extracted as U+FFFD
            block, says = BAD_ARGUMENTS[argument]
            out = environment.step(f"Let me look:\n```bash\n{block}\n```")
            assert out["done"] is False
            (observation,) = out["observations"]
            assert observation["content"].startswith("error: the `bash` block cannot run:")
            assert says in observation["content"]
        good = environment.step("```bash\ntrue\n```")
        assert good["observations"][0]["content"] == "ran ['bash', '-c', 'true\\n']"
    finally:
        environment.close()


def test_skyrl_an_answer_that_cannot_be_written_scores_zero_without_grading(
    env: None, echo: EchoSessions
) -> None:
    from trialbox.integrations.skyrl import TrialboxTextEnv

    environment = TrialboxTextEnv({}, {"task_ref": ADD_TASK})
    environment.init([])
    out = environment.step("```python\ndef add(a, b):\n    return '\ud800'\n```")
    assert (out["done"], out["reward"]) == (True, 0.0)
    assert out["metadata"]["status"] == Status.SUCCEEDED.value
    assert out["metadata"]["loss_mask"] is False
    assert "not valid Unicode" in out["metadata"]["feedback"]
    assert [call for call in echo.calls if call.files] == []
    assert environment.session is None  # closed: the episode is over


@pytest.mark.parametrize(
    "answer",
    [
        "def add(a, b):\n    return a + b\n" + "# pad\n" * 200_000,  # 1.2 MB
        "x = '" + "\x01" * 200_000 + "'\n",  # 200 KB of text, 1.2 MB as JSON
    ],
    ids=["1_2_mb", "escaped_controls"],
)
def test_skyrl_an_answer_too_large_for_a_session_call_is_the_models_zero(
    env: None, echo: EchoSessions, answer: str
) -> None:
    """Was a break: SessionError ("too large for one session message") escaped step(), and
    the session was left open."""
    from trialbox.integrations.skyrl import TrialboxTextEnv

    environment = TrialboxTextEnv({}, {"task_ref": ADD_TASK})
    environment.init([])
    out = environment.step(f"```python\n{answer}```")
    assert (out["done"], out["reward"], out["metadata"]["loss_mask"]) == (True, 0.0, False)
    assert "too large for one session message" in out["metadata"]["feedback"]
    assert [call for call in echo.calls if call.files] == []
    assert environment.session is None


def test_skyrl_an_answer_too_deep_for_the_parser_is_graded_not_a_crash(
    env: None, echo: EchoSessions
) -> None:
    """Was a break: an unlabelled block of `x = ---...1` (3 KB) raised RecursionError from
    the extractor out of step()."""
    from trialbox.integrations.skyrl import TrialboxTextEnv

    environment = TrialboxTextEnv({}, {"task_ref": ADD_TASK})
    environment.init([])
    try:  # the answer the episode's grade would write (grading needs the pipeline)
        deep = "x = " + "-" * 3000 + "1\n"
        assert environment._answer(fenced_blocks(f"```\n{deep}```")) is None  # no starter name
        assert environment._answer(fenced_blocks(f"```py\n{deep}```")) == deep
    finally:
        environment.close()


# --- the SDK's session calls -----------------------------------------------------------------


def test_a_session_closed_with_its_client_behaves_alike_on_both_faces(
    sessions_resources: Resources, echo: EchoSessions
) -> None:
    """Was a break: after Client.close(), Session.close() raised TrialboxError ("the client
    is closed") though close is idempotent, and a step raised TrialboxError where the async
    face raises SessionError (the adapters catch SessionError)."""
    client = Client(sessions_resources)
    session = client.session(Task.model_validate(ADD_TASK), ttl_s=60)
    client.close()
    assert session.closed and client.closed
    session.close()
    session.close()
    for call in (
        lambda: session.step(commands=[["true"]]),
        lambda: session.exec(["true"]),
        lambda: session.read_file("solution.py"),
        lambda: session.grade(),
        lambda: session.fork(1),
    ):
        with pytest.raises(SessionError, match=rf"^session {session.session_id} is closed$"):
            call()


def test_session_call_arguments_are_read_at_the_call_and_a_generator_runs(
    client: Client, echo: EchoSessions
) -> None:
    """Was a break: step(commands=<generator>) sent no command and "succeeded";
    step(commands=None) and fork("2") raised a raw TypeError, fork(-1) a SessionError, and
    read_file(None) went to the worker."""
    with client.session(Task.model_validate(ADD_TASK), ttl_s=60) as session:
        ran = session.step(commands=(["echo", str(i)] for i in range(2)))
        assert ran.feedback == "ran ['echo', '0']\nran ['echo', '1']"
        refused = {}
        calls: dict[str, Callable[[], object]] = {
            "commands_none": lambda: session.step(commands=None),  # type: ignore[arg-type]
            "fork_text": lambda: session.fork("2"),  # type: ignore[arg-type]
            "fork_fraction": lambda: session.fork(1.5),  # type: ignore[arg-type]
            "fork_nan": lambda: session.fork(float("nan")),  # type: ignore[arg-type]
            "fork_negative": lambda: session.fork(-1),
            "fork_too_many": lambda: session.fork(101),
            "read_none": lambda: session.read_file(None),  # type: ignore[arg-type]
        }
        for name, call in calls.items():
            with pytest.raises(InputError) as caught:
                call()
            refused[name] = str(caught.value)
        sent = len(echo.calls)
        assert session.step(commands=[["true"]]).feedback == "ran ['true']"
    assert refused == {
        "commands_none": "commands: a list of commands, got NoneType",
        "fork_text": "n: Input should be a valid integer",
        "fork_fraction": "n: Input should be a valid integer",
        "fork_nan": "n: Input should be a valid integer",
        "fork_negative": "n: Input should be greater than or equal to 0",
        "fork_too_many": "n: Input should be less than or equal to 100",
        "read_none": "path: Input should be a valid string",
    }
    assert sent == 1  # only the generator's step reached the worker


def test_a_command_given_as_one_string_is_refused_never_split_into_letters(
    client: Client, echo: EchoSessions
) -> None:
    """Was a break: `exec("ls -l")` ran the program `l` with the arguments `s`, ` `, `-`, `l`
    (a string is a sequence of strings); `step(commands=["ls"])` ran `l` and `s`. And a
    call that cannot run (a NUL) raised pydantic's ValidationError: now an InputError naming
    the field, with nothing sent and the session going on."""
    with client.session(Task.model_validate(ADD_TASK), ttl_s=60) as session:
        refused = {}
        for name, call in {
            "exec": lambda: session.exec("ls -l"),  # type: ignore[arg-type]
            "step": lambda: session.step(commands=["ls", "pwd"]),  # type: ignore[list-item]
            "commands": lambda: session.step(commands="ls"),  # type: ignore[arg-type]
            "nul": lambda: session.exec(["echo", "a\x00b"]),
            "a_number": lambda: session.step(commands=[5]),  # type: ignore[list-item]
        }.items():
            with pytest.raises(InputError) as caught:
                call()
            refused[name] = str(caught.value)
        assert session.step(commands=[["true"]]).feedback == "ran ['true']"
    assert refused == {
        "exec": "argv: a command is a list of strings (argv), not one string: "
        "['sh', '-c', 'ls -l']",
        "step": "commands[0]: a command is a list of strings (argv), not one string: "
        "['sh', '-c', 'ls -l']",
        "commands": "commands: a list of commands, not one string: [['sh', '-c', 'ls']]",
        "nul": "commands[0]: a command has at most 4096 arguments and no NUL characters",
        "a_number": "commands[0]: Input should be a valid list",
    }
    assert [call.commands for call in echo.calls if call.op == "exec"] == [[["true"]]]
