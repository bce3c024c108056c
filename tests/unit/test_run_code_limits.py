"""/run_code's answer fitting as pure logic (with a small budget), and the limits the docs
state against the constants that enforce them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trialbox import function_url as fu
from trialbox.integrations import sandbox_fusion as sf
from trialbox.local import function_urls
from trialbox.models.report import CommandResult, Status

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


def _fetch(stdout: str, truncated: bool = False) -> CommandResult:
    return CommandResult(
        phase="exec", argv=["sh"], status=Status.SUCCEEDED, exit_code=0, signal=None,
        timed_out=False, oom_killed=False, wall_s=0.1, cpu_s=0.1, peak_memory_mb=1.0,
        stdout=stdout, stderr="", stdout_truncated=truncated, stderr_truncated=False,
    )  # fmt: skip


def test_fetched_files_are_read_by_their_lines_in_order() -> None:
    out = "=YQ==\n-\n+\n~\n"
    fetched, said, left_out = sf._fetched(
        ["a", "gone", "huge", "late", "unanswered"], [_fetch(out)]
    )
    assert fetched == {"a": "YQ=="}
    assert left_out == ["files/late", "files/unanswered"]
    assert said[0] == "huge: over 3 MiB, not fetched" and "files/late left out" in said[1]


def test_a_fetch_cut_by_the_output_limit_keeps_only_its_whole_lines() -> None:
    """The runner keeps a cut stream's head and tail around a marker: a line in the tail (or
    cut by the marker) is not a file's whole base64, nor is it the right file's."""
    out = "=YQ==\n=Yg" + "\n[... 9 bytes omitted ...]\n" + "Yg==\n=Yw==\n"
    fetched, _, left_out = sf._fetched(["a", "b", "c"], [_fetch(out, truncated=True)])
    assert fetched == {"a": "YQ=="}
    assert left_out == ["files/b", "files/c"]


def test_the_docs_state_the_fetch_total_and_the_wait() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    assert f"{sf.MAX_FETCH_TOTAL_BYTES // 2**20} MiB in all" in docs
    call = sf.RunCodeRequest(code="1", run_timeout=1)
    post_run = sf.wait_s(call, 0) - 1
    assert f"+ {sf.WAIT_MARGIN_S:.0f} s + {sf.POST_RUN_S_PER_MIB} s for each MiB" in docs
    assert f"{post_run:.0f} s, or" in docs


def test_the_longest_wait_ends_before_the_functions_time_does() -> None:
    """The wait grows with the output a call may carry; the function's own timeout must still
    outlast it, or Lambda would end the call with no answer (a 502)."""
    longest = sf.RunCodeRequest(code="1", run_timeout=10**6, fetch_files=["a"])
    assert sf.wait_s(longest, sf.WAIT_MARGIN_S) < sf.FUNCTION_TIMEOUT_S - 1
