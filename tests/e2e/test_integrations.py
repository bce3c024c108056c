"""The trainer adapters on the local twin, called the way each framework calls them (the
keyword arguments are those of trl 1.16.0, verl 0.9.1 and skyrl-gym 0.4.0; see
docs/integrations.md), and SandboxFusion's endpoint through the real `sandbox-fusion` client
and verl's own request shape."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import multiprocessing
import os
import pickle
import runpy
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import sandbox_fusion
import skyrl_gym
import yaml

from tests.e2e import verl_signatures
from tests.support.tasks import ADD_TASK, CORRECT
from trialbox import constants as c
from trialbox.errors import InputError, SessionError
from trialbox.integrations import sandbox_fusion as sf
from trialbox.integrations import verl
from trialbox.integrations.common import Connection
from trialbox.integrations.skyrl import ENV_ID
from trialbox.integrations.trl import TrialboxReward, environment_factory
from trialbox.models import Task
from trialbox.sdk import Client, Resources
from trialbox.sdk.core import local_session

RIGHT = f"Here it is:\n```python\n{CORRECT}```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"  # passes neither test
HALF = "```python\ndef add(a, b):\n    return 3 if a > 0 else a - b\n```"  # passes one of two
NO_CODE = "I cannot write code today."
REVERSE_CASES = {"inputs": ["abc\n", "x\n"], "outputs": ["cba\n", "x\n"]}
REVERSE = "```python\nprint(input()[::-1])\n```"


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client.local(workers=2) as local:
        yield local


@pytest.fixture(scope="module")
def ref(client: Client) -> str:
    return client.push_tasks([Task.model_validate(ADD_TASK)], name="integrations").task("add-two")


@pytest.fixture
def twin_env(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment `trialbox local up` prints: what verl's and SkyRL's workers read."""
    twin = client.aio._twin
    assert twin is not None
    for name, value in twin.sdk_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(c.ENV_STACK, raising=False)


def trl_call(reward: Any, completions: list[Any], cells: list[Any], **extra: Any) -> Any:
    """As GRPOTrainer._calculate_rewards calls a reward function (trl 1.16.0)."""
    return reward(
        prompts=["Write add"] * len(completions),
        completions=completions,
        completion_ids=[[1, 2]] * len(completions),
        task_ref=cells,
        trainer_state=types.SimpleNamespace(global_step=0),
        **extra,
    )


# --- TRL ---------------------------------------------------------------------------------------


def test_trl_reward_grades_right_partial_wrong_and_no_code_and_logs_counts(
    client: Client, ref: str
) -> None:
    metrics: dict[str, float] = {}
    extra: dict[str, list[Any]] = {}
    reward = TrialboxReward(client)
    completions = [RIGHT, HALF, WRONG, NO_CODE]
    got = trl_call(
        reward,
        completions,
        [ref] * 4,
        log_metric=metrics.__setitem__,
        log_extra=lambda column, values: extra.setdefault(column, values),
    )
    assert got == [1.0, 0.5, 0.0, 0.0]
    assert metrics["trialbox/succeeded"] == 1.0
    assert metrics["trialbox/masked"] == 0.0
    # A conversational dataset's completions, and an inline task's JSON as the cell.
    conversational = [
        [{"role": "assistant", "content": RIGHT}],
        [{"role": "assistant", "content": WRONG}],
    ]
    assert trl_call(reward, conversational, [json.dumps(ADD_TASK)] * 2) == [1.0, 0.0]


def test_trl_reward_without_trainer_extras_from_threads_and_after_pickling(
    client: Client, ref: str
) -> None:
    reward = pickle.loads(pickle.dumps(TrialboxReward(client)))  # AsyncGRPOTrainer's way
    results: list[Any] = []

    def call(completion: str) -> None:
        results.append(reward(prompts=["p", "p"], completions=[completion] * 2, task_ref=[ref] * 2))

    threads = [threading.Thread(target=call, args=(c,)) for c in (RIGHT, WRONG)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [[0.0, 0.0], [1.0, 1.0]]


def _score_in_a_spawned_child(reward: TrialboxReward, ref: str, out: Any) -> None:
    out.put(reward(prompts=["p"], completions=[RIGHT], task_ref=[ref]))


def test_trl_reward_pickled_into_a_spawned_process_connects_there(client: Client, ref: str) -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(
        target=_score_in_a_spawned_child, args=(TrialboxReward(client), ref, out)
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert out.get(timeout=5) == [1.0]


def test_trl_reward_gives_none_never_zero_when_the_platform_fails(client: Client, ref: str) -> None:
    unreachable = Connection(resources=client.aio.resources, endpoint_url="http://127.0.0.1:9")
    metrics: dict[str, float] = {}
    got = trl_call(
        TrialboxReward(unreachable), [RIGHT, WRONG], [ref] * 2, log_metric=metrics.__setitem__
    )
    assert got == [None, None]
    assert metrics["trialbox/infrastructure_failed"] == 1.0
    assert metrics["trialbox/masked"] == 1.0


def test_trl_reward_says_what_is_wrong_with_the_dataset(client: Client, ref: str) -> None:
    reward = TrialboxReward(client)
    with pytest.raises(InputError, match="no column 'task_ref'"):
        reward(prompts=["p"], completions=[RIGHT], task=[ref])
    with pytest.raises(InputError, match="column 'task_ref'"):
        trl_call(reward, [RIGHT], [{"task_id": "no grading"}])


def test_trl_environment_runs_tools_in_a_session_and_grades_the_batch(
    client: Client, ref: str
) -> None:
    factory = environment_factory(client)
    # What GRPOTrainer does: the tools are the public methods but reset and get_reward.
    first, second = factory(), factory()
    tools = sorted(
        name
        for name, _ in __import__("inspect").getmembers(
            type(first), predicate=__import__("inspect").isfunction
        )
        if name not in ("reset", "get_reward") and not name.startswith("_")
    )
    assert tools == ["bash", "run_python"]
    assert first.reset(prompt=[{"role": "user", "content": "add"}], task_ref=ref) is None
    assert second.reset(prompt=[{"role": "user", "content": "add"}], task_ref=ref) is None
    assert "NotImplementedError" in first.bash(command="cat solution.py")
    first.bash(command=f"cat > solution.py <<'EOF'\n{CORRECT}EOF")
    assert "3" in first.run_python(code="from solution import add; print(add(1, 2))")
    assert [first.get_reward(), second.get_reward()] == [1.0, 0.0]
    # The pooled instance starts its next episode afresh.
    first.reset(task_ref=ref)
    assert "NotImplementedError" in first.bash(command="cat solution.py")
    first.reset(task_ref=ref)  # the open session is closed, not leaked
    assert first.get_reward() == 0.0


# --- verl --------------------------------------------------------------------------------------


def verl_call(**kwargs: Any) -> dict[str, Any]:
    """As verl's NaiveRewardManager awaits an async compute_score (verl 0.9.1)."""
    return asyncio.run(verl.compute_score(**kwargs))


def test_verl_compute_score_grades_a_task_ref_and_verl_style_test_cases(
    twin_env: None, ref: str
) -> None:
    right = verl_call(data_source="trialbox", solution_str=RIGHT, ground_truth=ref, extra_info={})
    assert right == {"score": 1.0, "loss_mask": 0.0, "status": "succeeded", "tests": 2.0}
    assert (
        verl_call(data_source="x", solution_str=WRONG, ground_truth=ref, extra_info=None)["score"]
        == 0.0
    )
    cases = json.dumps(REVERSE_CASES)  # verl's code sets keep their tests as JSON text
    assert verl_call(data_source="apps", solution_str=REVERSE, ground_truth=cases)["score"] == 1.0
    echo = "```python\nprint(input())\n```"
    assert verl_call(data_source="apps", solution_str=echo, ground_truth=cases)["score"] == 0.5
    # A call-based problem, as PRIME's and TACO's code sets store it; a LeetCode-style answer.
    calls = json.dumps(
        {"fn_name": "twice", "inputs": [[2], [[1, 2]]], "outputs": [[4], [[1, 2, 1, 2]]]}
    )
    method = (
        "```python\nclass Solution:\n    def twice(self, x: Any) -> Any:\n        return x * 2\n```"
    )
    assert verl_call(data_source="taco", solution_str=method, ground_truth=calls)["score"] == 1.0
    usage = "```python\ndef twice(x):\n    return x * 2\n```\nUse:\n```python\nprint(twice(3))\n```"
    assert verl_call(data_source="taco", solution_str=usage, ground_truth=calls)["score"] == 1.0


def test_verl_compute_score_is_zero_with_loss_mask_when_the_platform_fails(
    twin_env: None, ref: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIALBOX_ENDPOINT_URL", "http://127.0.0.1:9")
    scored = verl_call(data_source="x", solution_str=RIGHT, ground_truth=ref)
    assert scored == {
        "score": 0.0,
        "loss_mask": 1.0,
        "status": "infrastructure_failed",
        "tests": 0.0,
    }


@pytest.fixture
def verl_tool(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, module in verl_signatures.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "trialbox.integrations.verl_tool", raising=False)
    from trialbox.integrations.verl_tool import TrialboxTool

    return TrialboxTool


def test_verl_tool_keeps_the_episode_session_across_calls_and_the_reward_grades_it(
    twin_env: None, ref: str, verl_tool: Any
) -> None:
    async def episode() -> dict[str, Any]:
        agent_data = types.SimpleNamespace(request_id="episode-1", extra_fields={})
        create_kwargs = {"task": ref}

        async def call(parameters: dict[str, Any]) -> str:
            # tool_agent_loop._call_tool: a new instance id, one execute, a release, per call.
            tool = verl_tool(config={"type": "native"}, tool_schema=None)
            instance_id, _ = await tool.create(create_kwargs=create_kwargs)
            try:
                response, step_reward, _ = await tool.execute(
                    instance_id, parameters, agent_data=agent_data
                )
            finally:
                await tool.release(instance_id)
            assert step_reward == 0.0
            return str(response.text)

        assert "NotImplementedError" in await call({"command": "cat solution.py"})
        await call({"command": f"cat > solution.py <<'EOF'\n{CORRECT}EOF"})
        assert "3" in await call(
            {"command": "python -c 'from solution import add; print(add(1, 2))'"}
        )
        assert await call({"code": "1"}) == (
            "error: the `command` argument cannot run: give it as a string, not nothing"
        )
        extra_info = {"index": 0} | agent_data.extra_fields  # naive.py merges tool_extra_fields
        assert extra_info[verl.SESSION_FIELD] and extra_info[verl.CHECKPOINT_FIELD]
        # The final response holds no code: the workspace the tool left is what is graded.
        return await verl.compute_score("x", "done", ref, extra_info)

    assert verl_call_async(episode()) == {
        "score": 1.0,
        "loss_mask": 0.0,
        "status": "succeeded",
        "tests": 2.0,
    }
    assert verl._episodes == {}  # compute_score closed the session in this process


def verl_call_async(coro: Any) -> Any:
    return asyncio.run(coro)


def test_verl_tool_schema_is_verls_shape(verl_tool: Any) -> None:
    tool = verl_tool(config={"type": "native", "program": "python"}, tool_schema=None)
    assert tool.name == "run_python"
    assert tool.tool_schema.function["parameters"]["required"] == ["code"]
    with pytest.raises(InputError, match="program"):
        verl_tool(config={"type": "native", "program": "ruby"}, tool_schema=None)


# --- SkyRL -------------------------------------------------------------------------------------


def test_skyrl_env_runs_bash_then_grades_the_answer(twin_env: None, ref: str) -> None:
    env = skyrl_gym.make(ENV_ID, env_config={"max_turns": 3}, extras={"task_ref": ref})
    prompt = [{"role": "user", "content": "Write add"}]
    assert env.init(prompt)[0] == prompt
    looked = env.step("Let me look.\n```bash\ncat solution.py\n```")
    assert not looked["done"] and "NotImplementedError" in looked["observations"][0]["content"]
    answered = env.step(RIGHT)
    assert answered["done"] and answered["reward"] == 1.0
    assert answered["metadata"]["loss_mask"] is False
    env.close()


def test_skyrl_env_grades_test_cases_in_the_ground_truth(twin_env: None) -> None:
    extras = {"reward_spec": {"method": "rule", "ground_truth": json.dumps(REVERSE_CASES)}}
    env = skyrl_gym.make(ENV_ID, env_config={}, extras=extras)
    env.init([])
    assert env.step(REVERSE)["reward"] == 1.0


# --- SandboxFusion -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint(client: Client) -> Iterator[str]:
    """The twin's function URL of the RunCode function (its real handler, as on AWS), set as
    the sandbox-fusion client's endpoint for this module only (it is the library's global)."""
    twin = client.aio._twin
    assert twin is not None
    url = twin.outputs[c.OUTPUT_RUN_CODE_URL].rstrip("/")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox_fusion.config, "SANDBOX_ENDPOINT", url)
        patch.setattr(sandbox_fusion.config, "DATASET_ENDPOINT", url)
        yield url


def test_sandbox_fusion_client_runs_code_with_stdin_files_and_fetch(endpoint: str) -> None:
    from sandbox_fusion import RunCodeRequest, run_code

    ran = run_code(RunCodeRequest(code="print(input()[::-1])", stdin="hello", language="python"))
    assert (ran.status, ran.run_result.stdout, ran.run_result.return_code) == (
        "Success",
        "olleh\n",
        0,
    )
    files = {"in.txt": base64.b64encode(b"ab").decode()}
    copied = run_code(
        RunCodeRequest(
            code="open('out.txt', 'w').write(open('in.txt').read() * 2)",
            language="python",
            files=files,
            fetch_files=["out.txt", "never-written.txt"],
        )
    )
    assert copied.files == {"out.txt": base64.b64encode(b"abab").decode()}
    failed = run_code(RunCodeRequest(code="import sys; print('x'); sys.exit(3)", language="python"))
    assert (failed.status, failed.run_result.return_code, failed.run_result.stdout) == (
        "Failed",
        3,
        "x\n",
    )
    slow = run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=1))
    assert (slow.status, slow.run_result.status) == ("Failed", "TimeLimitExceeded")
    shell = run_code(RunCodeRequest(code="echo $((1 + 2))", language="bash"))
    assert shell.run_result.stdout == "3\n"


def test_verls_own_request_shape_and_its_verdicts(endpoint: str) -> None:
    # verl/utils/reward_score/sandbox_fusion/utils.py: the URL as configured, this JSON.
    payload = {
        "compile_timeout": 10, "run_timeout": 10, "code": "print(int(input()) * 2)",
        "stdin": "21\n", "memory_limit_MB": 1024, "language": "python", "files": {},
        "fetch_files": [],
    }  # fmt: skip
    answered = requests.post(f"{endpoint}/run_code", data=json.dumps(payload), timeout=30)
    assert answered.status_code == 200
    body = answered.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"].rstrip("\n") == "42"
    hungry = payload | {"code": "x = bytearray(400 * 2**20); print(len(x))", "memory_limit_MB": 64}
    starved = requests.post(f"{endpoint}/run_code", json=hungry, timeout=30).json()
    assert starved["status"] == "Failed" and starved["run_result"]["return_code"] != 0


def test_bad_requests_are_422_with_the_reason(endpoint: str) -> None:
    other = requests.post(f"{endpoint}/run_code", json={"code": "x", "language": "cpp"}, timeout=30)
    assert other.status_code == 422 and "python, bash" in other.json()["detail"]
    shapeless = requests.post(f"{endpoint}/run_code", json={"language": "python"}, timeout=30)
    assert shapeless.status_code == 422 and "code" in shapeless.json()["detail"]
    assert requests.post(f"{endpoint}/elsewhere", json={}, timeout=30).status_code == 404


def test_overload_and_platform_failures_answer_504_which_verl_retries(client: Client) -> None:
    full = sf.Endpoint(client, max_pending=1)
    assert full.slots.acquire(blocking=False)  # one call in flight
    status, body = full.answer(json.dumps({"code": "print(1)", "language": "python"}).encode())
    assert (status, json.loads(body)["status"]) == (504, "SandboxError")
    unreachable = Client(
        Resources.from_outputs(client.aio._twin.outputs),  # type: ignore[union-attr]
        endpoint_url="http://127.0.0.1:9",
        session=local_session(),
    )
    try:
        status, body = sf.Endpoint(unreachable).answer(
            b'{"code": "print(1)", "language": "python"}'
        )
    finally:
        unreachable.close()
    assert (status, json.loads(body)["status"]) == (504, "SandboxError")


# --- the examples, as a user runs them -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, client: Client, *args: str, **env: str) -> str:
    twin = client.aio._twin
    assert twin is not None
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=os.environ | twin.sdk_env() | env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_example_verl_reward_scores_a_sample_and_its_yaml_names_it(client: Client) -> None:
    printed = run_example("verl_reward.py", client)
    assert printed.strip() == str(
        {"score": 1.0, "loss_mask": 0.0, "status": "succeeded", "tests": 2.0}
    )
    config = yaml.safe_load((ROOT / "examples" / "verl_reward.yaml").read_text())
    spec = config["reward"]["custom_reward_function"]
    module = runpy.run_path(str(ROOT / spec["path"]))  # verl's load_extern_object, by path
    assert module[spec["name"]] is verl.compute_score


def test_example_verl_tool_runs_an_episode(
    twin_env: None, ref: str, verl_tool: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(sys, "argv", ["verl_tool.py", ref])
    runpy.run_path(str(ROOT / "examples" / "verl_tool.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "raise NotImplementedError" in printed
    assert printed.strip().endswith(
        str({"score": 1.0, "loss_mask": 0.0, "status": "succeeded", "tests": 2.0})
    )


def test_example_skyrl_env(client: Client, ref: str) -> None:
    printed = run_example("skyrl_env.py", client, ref)
    assert "raise NotImplementedError" in printed
    assert printed.strip().endswith("reward: 1.0 done: True")


def test_example_sandbox_fusion_client(client: Client, endpoint: str) -> None:
    printed = run_example("sandbox_fusion_client.py", client, SANDBOX_FUSION_ENDPOINT=endpoint)
    assert printed == "Success xoblairt\n"


def test_the_proxy_signs_each_call_and_forwards_it_to_the_function_url(endpoint: str) -> None:
    from sandbox_fusion import RunCodeRequest, run_code

    server = sf.serve(sf.Proxy(endpoint, local_session(), timeout_s=60))
    try:
        call = RunCodeRequest(code="print(6 * 7)", language="python")
        assert run_code(call, endpoint=sf.url(server)).run_result.stdout == "42\n"
    finally:
        server.shutdown()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A stand-in for AWS's side of the function URL: it answers `status` and keeps the
    request's headers."""

    status = 200
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(dict(self.headers))
        self.send_response(self.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("aws", "proxy"), [(200, 200), (422, 422), (403, 403), (413, 413), (429, 504), (502, 504)]
)
def test_the_proxy_signs_with_sigv4_and_maps_awss_answers(aws: int, proxy: int) -> None:
    _Recorder.status = aws
    _Recorder.seen = []
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{fake.server_address[1]}/"
        status, body = sf.Proxy(url, local_session(), timeout_s=10).answer(b'{"code": "1"}')
    finally:
        fake.shutdown()
    assert status == proxy
    authorization = _Recorder.seen[0]["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=local/")
    assert "/us-east-1/lambda/aws4_request" in authorization
    if proxy == 403:
        assert "TrialboxClientPolicy" in json.loads(body)["detail"]
    if proxy == 504:
        assert json.loads(body)["status"] == "SandboxError"


def test_the_proxy_answers_504_when_the_function_url_is_unreachable() -> None:
    status, body = sf.Proxy("http://127.0.0.1:9/", local_session(), timeout_s=5).answer(b"{}")
    assert (status, json.loads(body)["status"]) == (504, "SandboxError")


def test_a_call_answers_504_before_the_lambda_runs_out_of_time(client: Client) -> None:
    slow = json.dumps(
        {"code": "import time; time.sleep(8)", "language": "python", "run_timeout": 40}
    )
    started = time.monotonic()
    status, body = sf.Endpoint(client).answer(slow.encode(), time_left_s=4.0)
    assert (status, json.loads(body)["status"]) == (504, "SandboxError")
    assert time.monotonic() - started < 4.0
    # It was cancelled, not left to run unread: its result is recorded and its execution
    # stopped, which frees its sandbox (verl sends the call again).
    assert "cancelled" in json.loads(body)["message"], body
    aws = client.aio._aws
    items = aws.dynamodb.scan(TableName=client.aio.resources.executions_table)["Items"]
    cancelled = [
        i["request_id"]["S"]
        for i in items
        if i["request_id"]["S"].startswith("sandbox-fusion-") and i["status"]["S"] == "cancelled"
    ]
    assert len(cancelled) == 1, items
    assert client.aio.resources.rollout_arn is not None
    execution = client.aio.resources.rollout_arn.replace(":stateMachine:", ":execution:")
    # (moto aborts an execution waiting on a task token when that wait ends: the sleep's end)
    deadline = time.monotonic() + 60
    while aws.sfn.describe_execution(executionArn=f"{execution}:{cancelled[0]}")["status"] != (
        "ABORTED"
    ):
        assert time.monotonic() < deadline, "the execution was not stopped"
        time.sleep(0.5)


# --- red team: what a hostile caller or an odd dataset found (each failed before its fix) ------


def test_a_ref_to_a_task_set_never_pushed_or_malformed_is_the_trainers_error(
    client: Client,
) -> None:
    reward = TrialboxReward(client)
    with pytest.raises(SessionError, match=r"no task set rt@0+ was pushed"):
        trl_call(reward, [RIGHT], ["rt@" + "0" * 64 + "/add-two"])
    with pytest.raises(InputError, match="not of the form taskset@version/task_id"):
        trl_call(reward, [RIGHT], ["justaname"])


def test_odd_completions_are_their_samples_zero_and_messages_their_assistants_text(
    client: Client, ref: str
) -> None:
    reward = TrialboxReward(client)
    odd = [None, 5, {"content": RIGHT}, []]
    assert trl_call(reward, odd, [ref] * 4) == [0.0, 0.0, 0.0, 0.0]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": RIGHT}]}]
    tool_last = [{"role": "assistant", "content": RIGHT}, {"role": "tool", "content": "3"}]
    assert trl_call(reward, [parts, tool_last], [ref] * 2) == [1.0, 1.0]
    with pytest.raises(InputError, match="2 completions but 1 prompts"):
        reward(prompts=["p"], completions=[RIGHT, WRONG], task_ref=[ref] * 2)


def test_configuration_mistakes_are_input_errors_and_a_graded_episode_says_so(
    twin_env: None, client: Client, ref: str
) -> None:
    forged = {verl.CHECKPOINT_FIELD: "not-a-checkpoint", verl.SESSION_FIELD: "s"}
    with pytest.raises(InputError, match=verl.CHECKPOINT_FIELD):
        verl_call(data_source="x", solution_str=RIGHT, ground_truth=ref, extra_info=forged)
    with pytest.raises(InputError, match="max_turns"):
        skyrl_gym.make(ENV_ID, env_config={"max_turns": "abc"}, extras={"task_ref": ref})
    env = skyrl_gym.make(ENV_ID, env_config={}, extras={"task_ref": ref})
    env.init([])
    env.step(RIGHT)
    with pytest.raises(InputError, match="no episode"):
        env.step(RIGHT)
    episode = environment_factory(client)()
    episode.reset(task_ref=ref)
    assert episode.get_reward() == 0.0
    assert episode.bash(command="true").startswith("error: the episode is graded")


def test_skyrl_an_output_block_after_the_work_replaces_nothing(twin_env: None, ref: str) -> None:
    env = skyrl_gym.make(ENV_ID, env_config={}, extras={"task_ref": ref})
    env.init([])
    env.step(f"```bash\ncat > solution.py <<'EOF'\n{CORRECT}EOF\n```")
    assert env.step("It prints:\n```\n3\n```")["reward"] == 1.0


def test_run_code_answers_with_a_trailing_slash_too(endpoint: str) -> None:
    # SandboxFusion (FastAPI) redirects /run_code/ to /run_code, so clients written for it work.
    call = {"code": "print(6 * 7)", "language": "python"}
    answered = requests.post(f"{endpoint}/run_code/", json=call, timeout=60)
    assert (answered.status_code, answered.json()["run_result"]["stdout"]) == (200, "42\n")


def test_run_code_returns_output_over_the_tables_300_kb_in_full(endpoint: str) -> None:
    # Was a 504: the table keeps such a result without its commands; the trace has them.
    call = {"code": "import sys; sys.stdout.write('7' * 400_000)", "language": "python"}
    answered = requests.post(f"{endpoint}/run_code", json=call, timeout=60)
    assert answered.status_code == 200, answered.text
    assert answered.json()["run_result"]["stdout"] == "7" * 400_000


def test_run_code_beyond_its_concurrency_is_throttled_at_once_and_the_proxy_says_504(
    endpoint: str,
) -> None:
    # Was unbounded: the twin queued every call, past its deadline, and verl's read timed out.
    # As Lambda at its reserved concurrency: 429 at once (the twin runs at most 8 copies).
    call = {"code": "import time; time.sleep(3)", "run_timeout": 10}
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(
            lambda _: requests.post(f"{endpoint}/run_code", json=call, timeout=60), range(12)
        ))  # fmt: skip
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 8 + [429] * 4, statuses
    assert sf.proxied(429, '{"Message":"Rate Exceeded."}')[0] == 504  # verl retries a 504


def test_run_code_caps_what_sandbox_fusion_takes_rather_than_refuse_it(endpoint: str) -> None:
    # Was a 422, which verl scores as a failed sample: SandboxFusion takes these.
    call = {"code": "print(1)", "run_timeout": 4000, "memory_limit_MB": 1e6 + 0.5,
            "compile_timeout": 0}  # fmt: skip
    answered = requests.post(f"{endpoint}/run_code", json=call, timeout=120)
    assert (answered.status_code, answered.json()["run_result"]["stdout"]) == (200, "1\n")


def test_run_code_bodies_that_are_not_utf8_are_422_not_a_crash(endpoint: str) -> None:
    answered = requests.post(
        f"{endpoint}/run_code", data=b'{"code": "print(1) # \xe9"}', timeout=30
    )
    assert answered.status_code == 422


def test_run_code_fetches_large_files_only_regular_ones_and_only_in_the_workspace(
    endpoint: str,
) -> None:
    big = {"code": "open('out.bin', 'wb').write(b'a' * 100_000)", "language": "python"}
    fetched = requests.post(
        f"{endpoint}/run_code", json=big | {"fetch_files": ["out.bin"]}, timeout=60
    )
    assert base64.b64decode(fetched.json()["files"]["out.bin"]) == b"a" * 100_000
    fifos = "import os\nfor i in range(4): os.mkfifo(f'p{i}')\n"
    call = {
        "code": fifos,
        "language": "python",
        "run_timeout": 3,
        "fetch_files": [f"p{i}" for i in range(4)],
    }
    started = time.monotonic()
    blocked = requests.post(f"{endpoint}/run_code", json=call, timeout=60)
    assert blocked.json()["files"] == {} and time.monotonic() - started < 10
    # A sparse 100 GB file is left out by its size, at once; 3,000,000 bytes come back.
    sparse = "open('s', 'wb').truncate(10**11)\nopen('m', 'wb').write(b'm' * 3_000_000)\n"
    call = {"code": sparse, "run_timeout": 3, "fetch_files": ["s", "m"]}
    answered = requests.post(f"{endpoint}/run_code", json=call, timeout=60)
    assert answered.status_code == 200, answered.text
    assert answered.json()["message"] == "s: over 3 MiB, not fetched"
    assert base64.b64decode(answered.json()["files"]["m"]) == b"m" * 3_000_000
    for outside in ("/etc/passwd", "../x"):
        refused = requests.post(
            f"{endpoint}/run_code", json={"code": "1", "fetch_files": [outside]}, timeout=30
        )
        assert refused.status_code == 422, outside
