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
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import verl_signatures
from tests.support.echo_sessions import EchoSessions
from tests.support.moto import Aws
from tests.support.tasks import ADD_TASK
from trialbox import constants as c
from trialbox.errors import InputError
from trialbox.integrations import common, verl
from trialbox.integrations.common import STACK_ENV
from trialbox.integrations.trl import environment_factory
from trialbox.models import Status, Task
from trialbox.sdk import Client, Resources, sessions

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
    """A session's outbox is read without a long poll: moto serves one call at a time, and a
    1 s poll would hold up the echo worker."""
    monkeypatch.setattr(sessions, "REPLY_WAIT_S", 0)


@pytest.fixture
def sessions_resources(aws: Aws, resources: Resources) -> Resources:
    return Resources(
        requests_queue_url=resources.requests_queue_url,
        executions_table=resources.executions_table,
        traces_bucket=resources.traces_bucket,
        tasksets_bucket=resources.tasksets_bucket,
        work_queue_url=aws.work_queue,
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
        c.ENV_WORK_QUEUE_URL: r.work_queue_url or "",
        c.ENV_SESSION_QUEUE_PREFIX: r.session_queue_prefix or "",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(STACK_ENV, raising=False)
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
    environment = environment_factory(client, task_column="task", ttl_s=1)()
    environment.reset(task=ADD_TASK)
    assert environment.bash(command="true") == "ran ['bash', '-c', 'true']"
    time.sleep(1.2)
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


# --- the SDK's session calls -----------------------------------------------------------------


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
