"""/run_code's answer fitting as pure logic (with a small budget), and the limits the docs
state against the constants that enforce them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trialbox import function_url as fu
from trialbox.integrations import sandbox_fusion as sf
from trialbox.local import function_urls

BUDGET = 20_000


@pytest.fixture(autouse=True)
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sf, "MAX_ANSWER_BYTES", BUDGET)


def _response(stdout: str = "", stderr: str = "", **files: str) -> sf.RunCodeResponse:
    run = sf.CommandRunResult(status=sf.CommandRunStatus.FINISHED, stdout=stdout, stderr=stderr)
    return sf.RunCodeResponse(status=sf.RunStatus.SUCCESS, run_result=run, files=files)


def test_an_answer_within_the_budget_is_untouched() -> None:
    response = _response("ok\n", "", a="QUJD")
    assert sf.fit_answer(response) == json.dumps(response.model_dump(mode="json"))


def test_the_smaller_stream_stays_whole_and_the_larger_is_cut_to_its_beginning() -> None:
    answer = json.loads(sf.fit_answer(_response("\ufffd" * 50_000, "short error")))
    assert fu.payload_bytes(json.dumps(answer)) <= BUDGET
    assert answer["run_result"]["stderr"] == "short error"
    stdout = answer["run_result"]["stdout"]
    assert 2_000 < len(stdout) < 50_000 and set(stdout) == {"\ufffd"}  # 7 bytes each
    assert answer["truncated"] == ["run_result.stdout"]
    assert f"run_result.stdout cut to its first {len(stdout)} of 50000" in answer["message"]


def test_a_file_is_whole_or_left_out_and_what_the_streams_leave_takes_it() -> None:
    answer = json.loads(
        sf.fit_answer(_response("x" * 100, "", big="A" * 30_000, small="B" * 5_000))
    )
    assert fu.payload_bytes(json.dumps(answer)) <= BUDGET
    assert answer["files"] == {"small": "B" * 5_000}
    assert answer["truncated"] == ["files/big"] and "files/big left out" in answer["message"]
    assert answer["run_result"]["stdout"] == "x" * 100
    # An equal share leaves each of three 8,000-byte files out; what is left takes two.
    files = {name: name * 8_000 for name in "CDE"}
    answer = json.loads(sf.fit_answer(_response("", "", **files)))
    assert len(answer["files"]) == 2 and len(answer["truncated"]) == 1


def test_the_runs_own_truncation_stays_marked_when_the_answer_is_cut() -> None:
    response = _response("y" * 50_000).model_copy(update={"truncated": ["run_result.stdout"]})
    answer = json.loads(sf.fit_answer(response))
    assert answer["truncated"] == ["run_result.stdout"]


@pytest.mark.parametrize(
    "text", ["plain", 'quo"te\\s', "\0\x01\x7f", "\ufffd" * 3, "\U0001f600", "\udcff"]
)
def test_a_strings_cost_is_its_size_escaped_twice(text: str) -> None:
    assert sf._cost(text * 100) == fu.payload_bytes(json.dumps(text * 100))


def test_the_docs_state_the_limits_the_code_enforces() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    assert f"{fu.MAX_REQUEST_BYTES:,} bytes for the request's event" in docs
    assert f"{fu.MAX_RESPONSE_BYTES:,} for the function's answer" in docs
    assert (
        f"serve at most {sf.MAX_CONNECTIONS} and {function_urls.MAX_CONNECTIONS} connections"
        in docs
    )
    assert f"received whole within {fu.REQUEST_DEADLINE_S:.0f} s" in docs
    assert f"read whole within {fu.REQUEST_DEADLINE_S:.0f} s" in docs
