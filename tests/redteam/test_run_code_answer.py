"""Red team on /run_code's answer size: whatever the policy's code writes, the answer fits
Lambda's 6 MB response as Lambda measures it (the answer's JSON as a string inside the
function's JSON), with what was cut named in `truncated`. Was a break: one line writing 1 MiB
of invalid UTF-8 made a 6.29 MB answer (each replaced byte is `\\ufffd` in JSON: 6 bytes, 7
inside Lambda's JSON), which AWS answers 502, the proxy 504, and verl retries three times and
then fails the sample. The variants run on both backends, through the pool's runner and
`response_for`; the first runs the whole path: the twin's function URL and the real handler."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from trialbox import constants as c
from trialbox.function_url import MAX_RESPONSE_BYTES, payload_bytes
from trialbox.integrations import sandbox_fusion as sf
from trialbox.models import Sample, Status
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score
from trialbox.sdk import Client

MIB = 2**20
SLACK = 64 * 1024  # what the fitting keeps for its notes
INVALID_UTF8 = "import sys\nsys.stdout.buffer.write(b'\\xff' * 2**20)\n"


def _fits(answer: str) -> bool:
    """Within Lambda's limit as the function returns it: the answer as its body string."""
    envelope = {"statusCode": 200, "headers": {"Content-Type": "application/json"}}
    return payload_bytes(envelope | {"body": answer, "isBase64Encoded": False}) <= (
        MAX_RESPONSE_BYTES
    )


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client.local(workers=1) as local:
        yield local


def test_a_mib_of_invalid_utf8_through_the_function_url_fits_with_the_cut_marked(
    client: Client,
) -> None:
    twin = client.aio._twin
    assert twin is not None
    url = twin.outputs[c.OUTPUT_RUN_CODE_URL].rstrip("/")
    call = {"code": INVALID_UTF8, "language": "python"}
    answered = requests.post(f"{url}/run_code", json=call, timeout=120)
    assert answered.status_code == 200, answered.text[:500]
    assert _fits(answered.text)
    body = answered.json()
    assert body["status"] == "Success"
    assert body["truncated"] == ["run_result.stdout"]
    stdout = body["run_result"]["stdout"]
    assert 500_000 < len(stdout) < MIB and set(stdout) == {"\ufffd"}
    assert "run_result.stdout cut to its first" in body["message"]


EMOJI = "\U0001f600"  # 4 bytes sent raw, 12 in an ASCII-escaped answer


@pytest.mark.parametrize(
    "call",
    [
        {"code": "x", "language": EMOJI * 2**20},  # quoted back in the error
        {"code": "x", "files": {EMOJI * 2**20: 5}},  # a field's name in the error's location
        {"code": "x", "files": {str(i): 5 for i in range(200_000)}},  # an error for each
    ],
    ids=["language", "file-name", "many-bad-files"],
)
def test_a_refusal_quoting_the_request_fits_too(client: Client, call: dict[str, Any]) -> None:
    twin = client.aio._twin
    assert twin is not None
    url = twin.outputs[c.OUTPUT_RUN_CODE_URL].rstrip("/")
    raw = json.dumps(call, ensure_ascii=False).encode()
    answered = requests.post(
        f"{url}/run_code", data=raw, headers={"Content-Type": "application/json"}, timeout=120
    )
    assert answered.status_code == 422, answered.text[:500]
    assert len(answered.json()["detail"]) < 5000 and "characters more" in answered.text


# --- the variants, on both backends ---------------------------------------------------------------

# Each: the call, and what the answer must keep whole. Every stream is at the run's output limit
# (4 MiB), in the characters that cost most in JSON.
FILE_SIZE = 3 * MIB - 4096  # under the 3 MiB a fetch takes
MANY_FILES = "".join(
    f"open('f{i}.bin', 'wb').write(bytes(range(256)) * {FILE_SIZE // 256})\n" for i in range(16)
)
VARIANTS: dict[str, dict[str, Any]] = {
    "invalid-utf8-stdout": {"code": INVALID_UTF8},
    "both-streams-full-of-replaced-bytes": {
        "code": "import sys\nsys.stdout.buffer.write(b'\\x80' * 5 * 2**20)\n"
        "sys.stderr.buffer.write(b'\\xfe' * 5 * 2**20)\n"
    },
    "a-line-of-nul": {"code": "print('\\0' * 5 * 2**20)\n"},
    "astral-characters": {"code": "print('\\U0001F600' * 2**20)\n"},
    "backslashes-and-quotes": {"code": "print('\\\\\"' * 3 * 2**20)\n"},
    "sixteen-files-of-3-mib": {
        "code": MANY_FILES + "print('done')\n",
        "fetch_files": [f"f{i}.bin" for i in range(16)],
    },
    "files-and-a-full-stdout": {
        "code": MANY_FILES[: MANY_FILES.index("\n") + 1] + "print('\\0' * 5 * 2**20)\n",
        "fetch_files": ["f0.bin"],
    },
}


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def runner(request: pytest.FixtureRequest) -> Runner:
    return Runner(SandboxConfig.from_env().model_copy(update={"backend": request.param}))


def _answer(runner: Runner, fields: dict[str, Any]) -> tuple[sf.RunCodeResponse, str]:
    """The call run as the pool runs it (its ungraded request), and the endpoint's answer."""
    call = sf.RunCodeRequest.model_validate({"language": "python"} | fields)
    request = sf.execution_request(call)
    sample = Sample(
        task_id=sf.RUN_CODE_TASK.task_id, sample_id="s", files=request.files,
        commands=request.commands,
    )  # fmt: skip
    report = runner.run(sf.RUN_CODE_TASK, sample, grade=False)
    result = score(sf.RUN_CODE_TASK.grading, report)
    assert result.status != Status.SANDBOX_ERROR, result.error
    response = sf.response_for(call, result)
    return response, sf.fit_answer(response)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_answer_fits_and_marks_what_was_cut(runner: Runner, name: str) -> None:
    whole, answer = _answer(runner, VARIANTS[name])
    assert _fits(answer)
    fitted = json.loads(answer)
    run = fitted["run_result"]
    assert whole.run_result is not None
    for stream in ("stdout", "stderr"):
        kept, full = run[stream], getattr(whole.run_result, stream)
        assert full.startswith(kept)  # a cut keeps the beginning
        cut = len(kept) < len(full) or f"run_result.{stream}" in whole.truncated
        assert (f"run_result.{stream}" in fitted["truncated"]) == cut
    for path in VARIANTS[name].get("fetch_files", []):
        if path in fitted["files"]:  # a file is whole or left out, and then named
            data = base64.b64decode(fitted["files"][path])
            assert (
                hashlib.sha256(data).digest()
                == hashlib.sha256(bytes(range(256)) * (FILE_SIZE // 256)).digest()
            )
        else:
            assert f"files/{path}" in fitted["truncated"]
            assert f"files/{path} left out" in fitted["message"]
    assert fitted["truncated"], "each variant is over 6 MB whole"
    # What fits is kept: a cut stream leaves no room, nor does a file left out.
    full = sf.MAX_ANSWER_BYTES - SLACK
    cut_here = set(fitted["truncated"]) - set(whole.truncated)
    if cut_here & {"run_result.stdout", "run_result.stderr"}:
        assert payload_bytes(answer) > full
    for path in set(whole.files) - set(fitted["files"]):
        with_it = fitted | {"files": fitted["files"] | {path: whole.files[path]}}
        assert payload_bytes(json.dumps(with_it)) > full


def test_an_answer_that_fits_is_whole(runner: Runner) -> None:
    response, answer = _answer(runner, {"code": "print('é' * 1000)"})
    assert json.loads(answer) == response.model_dump(mode="json")
    assert json.loads(answer)["truncated"] == []


def test_the_runs_own_output_limit_is_marked_too(runner: Runner) -> None:
    _, answer = _answer(runner, {"code": "print('x' * 5 * 2**20)"})
    assert json.loads(answer)["truncated"] == ["run_result.stdout"]


def test_the_fetched_files_total_is_bounded_as_the_answer_is(runner: Runner) -> None:
    """A 6 MB answer has no room for 48 MB of files: carrying them through the result (the
    Recorder and Scorer functions decode it, 512 MB each) is what ran those out of memory.
    Files are fetched whole while their total is within MAX_FETCH_TOTAL_BYTES; the rest are
    left out and named."""
    size = 1_500_000
    code = "".join(f"open('g{i}', 'wb').write(b'{i}' * {size})\n" for i in range(4))
    paths = [f"g{i}" for i in range(4)]
    whole, answer = _answer(runner, {"code": code, "fetch_files": paths})
    assert sorted(whole.files) == ["g0", "g1"]  # 3,000,000 bytes of the 3 MiB
    assert base64.b64decode(whole.files["g1"]) == b"1" * size
    assert whole.truncated == ["files/g2", "files/g3"]
    assert "files/g2 left out" in whole.message and "3 MiB in all" in whole.message
    assert json.loads(answer)["truncated"] == ["files/g2", "files/g3"]


def test_a_run_that_writes_a_lot_near_its_timeout_gets_its_verdict_not_a_504(
    client: Client,
) -> None:
    """The post-run work (carrying the output: the trace, the result's polling) grows with the
    output; the wait covers the most a call can write, so a policy's output never makes the
    platform answer 504 (which verl retries, three times) instead of its TimeLimitExceeded."""
    code = (
        "import os\nos.write(1, b'\\x01' * 5 * 2**20)\nos.write(2, b'\\x01' * 5 * 2**20)\n"
        "while True: pass\n"
    )
    call = {"code": code, "language": "python", "run_timeout": 2}
    endpoint = sf.Endpoint(client)
    started = time.monotonic()
    status, body = endpoint.answer(json.dumps(call).encode())
    took = time.monotonic() - started
    assert status == 200, body[:300]
    assert json.loads(body)["run_result"]["status"] == "TimeLimitExceeded"
    wait = sf.wait_s(sf.RunCodeRequest.model_validate(call), sf.WAIT_MARGIN_S)
    assert took < 0.8 * wait, f"{took:.1f} s of a {wait:.0f} s wait: too little headroom"
