"""Data contracts: limits, paths, files, tasks, grading commands, refs, requests, reward rules."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from trialbox.models import (
    REWARD_RULES,
    EncodedFile,
    ExecutionRequest,
    ExecutionResult,
    GradingSpec,
    LimitOverrides,
    Limits,
    Sample,
    Status,
    Task,
    TaskRef,
    reward_for,
)
from trialbox.models.sample import EPISODES

HIDDEN = {"tests/test_a.py": "def test_x():\n    pass\n"}
GRADING = {"command": ["pytest"]}
PATH_COMPONENT = "has an empty, '.' or '..' component; it must stay inside the workspace"


def errors(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[tuple[object, ...], str]]:
    return [(tuple(e["loc"]), e["msg"]) for e in exc.value.errors()]


def make_task(**fields: object) -> Task:
    return Task.model_validate(
        {"task_id": "t", "hidden_tests": HIDDEN, "grading": GRADING} | fields
    )


def test_limits_defaults() -> None:
    assert Limits().model_dump() == {
        "timeout_s": 10.0,
        "memory_mb": 512,
        "disk_mb": 64,
        "pids": 128,
        "cpus": 1.0,
        "output_bytes": 65536,
    }


def test_effective_keeps_disk_within_half_of_memory() -> None:
    limits = Limits()
    assert limits.effective() == (limits, [])


def test_effective_clamps_disk_to_half_of_memory_with_a_note() -> None:
    limits, notes = Limits(memory_mb=100, disk_mb=64).effective()
    assert limits.disk_mb == 50
    assert limits.memory_mb == 100
    assert notes == [
        "disk_mb 64 clamped to 50 (half of memory_mb 100): "
        "the workspace is a tmpfs charged to the memory limit"
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory_mb", 0, "Input should be greater than or equal to 32"),
        ("memory_mb", 10**9, "Input should be less than or equal to 65536"),
        ("timeout_s", 0, "Input should be greater than 0"),
        ("pids", 0, "Input should be greater than or equal to 8"),
    ],
)
def test_limit_bounds(field: str, value: int, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Limits.model_validate({field: value})
    assert errors(exc) == [((field,), message)]


def test_overrides_only_tighten() -> None:
    base = Limits(timeout_s=20, memory_mb=256, pids=64)
    tightened = LimitOverrides(timeout_s=5, memory_mb=1024, pids=32).tighten(base)
    assert tightened.model_dump() == {
        "timeout_s": 5.0,
        "memory_mb": 256,
        "disk_mb": 64,
        "pids": 32,
        "cpus": 1.0,
        "output_bytes": 65536,
    }
    assert LimitOverrides().tighten(base) == base


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../x", f"path '../x' {PATH_COMPONENT}"),
        ("/etc/passwd", "path '/etc/passwd' is absolute; paths are relative to the workspace"),
        ("a/../b", f"path 'a/../b' {PATH_COMPONENT}"),
        ("a//b", f"path 'a//b' {PATH_COMPONENT}"),
        ("./a", f"path './a' {PATH_COMPONENT}"),
        ("", "path must be 1 to 1024 characters"),
    ],
)
@pytest.mark.parametrize("field", ["workspace", "hidden_tests"])
def test_bad_relative_paths_in_task(field: str, path: str, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        make_task(**{field: {path: "x"}})
    assert errors(exc) == [((field, path, "[key]"), f"Value error, {message}")]


def test_bad_relative_path_in_sample_files() -> None:
    with pytest.raises(ValidationError) as exc:
        Sample(task_id="t", sample_id="s", files={"../x": "a"})
    assert errors(exc) == [
        (("files", "../x", "[key]"), f"Value error, path '../x' {PATH_COMPONENT}")
    ]


def test_file_and_directory_collision() -> None:
    with pytest.raises(ValidationError) as exc:
        make_task(workspace={"a": "x", "a/b": "y"})
    assert errors(exc) == [
        (("workspace",), "Value error, a is a file and also the directory of a/b")
    ]


def test_encoded_file_decodes_with_mode() -> None:
    encoded = EncodedFile(base64=base64.b64encode(b"\x00\xffbin").decode(), mode="0755")
    assert encoded.content() == b"\x00\xffbin"
    assert encoded.mode_bits() == 0o755
    assert EncodedFile(base64="aGk=").mode_bits() == 0o644
    task = make_task(workspace={"run.sh": {"base64": "aGk=", "mode": "755"}})
    assert task.workspace["run.sh"] == EncodedFile(base64="aGk=", mode="755")


def test_encoded_file_rejects_bad_base64_and_mode() -> None:
    with pytest.raises(ValidationError) as exc:
        EncodedFile(base64="!!")
    assert errors(exc) == [
        ((), "Value error, base64 content does not decode: Only base64 data is allowed")
    ]
    with pytest.raises(ValidationError) as exc:
        EncodedFile(base64="aGk=", mode="4755")
    assert errors(exc) == [
        (
            ("mode",),
            'Value error, mode \'4755\' is not a permission such as "0644" or "0755" (three '
            "octal digits; setuid, setgid and sticky bits are not allowed)",
        )
    ]


def test_unknown_field_rejected_and_metadata_accepted() -> None:
    with pytest.raises(ValidationError) as exc:
        make_task(bogus=1)
    assert errors(exc) == [(("bogus",), "Extra inputs are not permitted")]
    assert make_task(metadata={"difficulty": 3, "tags": ["x"]}).metadata == {
        "difficulty": 3,
        "tags": ["x"],
    }


def test_schema_version() -> None:
    assert make_task().schema_version == 1
    with pytest.raises(ValidationError) as exc:
        make_task(schema_version=2)
    assert errors(exc) == [(("schema_version",), "Input should be 1")]


@pytest.mark.parametrize(
    "command",
    [
        ["python", "-m", "pytest", "-q", "tests"],
        ["pytest"],
        ["pytest", "-q", "-x", "-rfE", "-k", "not slow"],
    ],
)
def test_grading_command_accepted(command: list[str]) -> None:
    assert GradingSpec(command=command).command == command


def test_grading_command_must_be_pytest() -> None:
    with pytest.raises(ValidationError) as exc:
        GradingSpec(command=["bash", "-c", "x"])
    assert errors(exc) == [
        (
            ("command",),
            'Value error, the grading command must be ["python", "-m", "pytest", ARGS...] '
            'or ["pytest", ARGS...]',
        )
    ]


@pytest.mark.parametrize(
    "option", ["-p", "-pfoo", "-qp", "--junitxml=x", "-c", "--rootdir=/", "-o", "--override-ini=x"]
)
def test_forbidden_pytest_options(option: str) -> None:
    with pytest.raises(ValidationError) as exc:
        GradingSpec(command=["python", "-m", "pytest", option, "x"])
    assert errors(exc) == [
        (
            ("command",),
            f"Value error, grading option {option!r} is not allowed: the runner sets pytest's "
            "config, plugins and report itself",
        )
    ]


def test_expected_tests_must_be_in_hidden_tests() -> None:
    with pytest.raises(ValidationError) as exc:
        make_task(grading={"command": ["pytest"], "expected_tests": ["solution.py::test_x"]})
    assert errors(exc) == [
        (
            (),
            "Value error, expected test 'solution.py::test_x' is not in a hidden_tests file "
            "(tests/test_a.py)",
        )
    ]
    task = make_task(grading={"command": ["pytest"], "expected_tests": ["tests/test_a.py::test_x"]})
    assert task.grading.expected_tests == ["tests/test_a.py::test_x"]


def test_expected_tests_must_be_node_ids() -> None:
    with pytest.raises(ValidationError) as exc:
        GradingSpec(command=["pytest"], expected_tests=["tests/test_a.py"])
    assert errors(exc) == [
        (
            ("expected_tests",),
            "Value error, 'tests/test_a.py' is not a pytest node id such as "
            "'tests/test_x.py::test_name'",
        )
    ]


def test_task_ref_parse() -> None:
    ref = TaskRef.parse("set@v1/a/b")
    assert (ref.taskset, ref.version, ref.task_id) == ("set", "v1", "a/b")
    assert str(ref) == "set@v1/a/b"


@pytest.mark.parametrize("bad", ["set@v1/", "nope"])
def test_task_ref_rejected(bad: str) -> None:
    with pytest.raises(ValueError) as exc:
        TaskRef.parse(bad)
    assert str(exc.value) == f"task ref {bad!r} is not of the form taskset@version/task_id"


def test_request_needs_exactly_one_task() -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(request_id="r1")
    assert errors(exc) == [((), "Value error, give exactly one of task_ref and task")]
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(request_id="r1", task_ref="s@v/t", task=make_task())
    assert errors(exc) == [((), "Value error, give exactly one of task_ref and task")]
    assert ExecutionRequest(request_id="r1", task=make_task()).task == make_task()
    assert ExecutionRequest(request_id="r1", task_ref="s@v/t").task_ref == "s@v/t"


def test_request_task_ref_is_parsed() -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(request_id="r1", task_ref="nope")
    assert errors(exc) == [
        ((), "Value error, task ref 'nope' is not of the form taskset@version/task_id")
    ]


@pytest.mark.parametrize("request_id", ["a", "A-z_09", "x" * 80])
def test_request_id_accepted(request_id: str) -> None:
    assert ExecutionRequest(request_id=request_id, task_ref="s@v/t").request_id == request_id


@pytest.mark.parametrize("request_id", ["", "a b", "a/b", "x" * 81, "é"])
def test_request_id_rejected(request_id: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(request_id=request_id, task_ref="s@v/t")
    assert errors(exc) == [
        (
            ("request_id",),
            "Value error, request_id must be 1 to 80 characters of A-Z, a-z, 0-9, '_' or '-' "
            "(it names a Step Functions execution)",
        )
    ]


def test_reward_for_succeeded_uses_the_scorer() -> None:
    assert reward_for(Status.SUCCEEDED, 0.75) == (0.75, False)


@pytest.mark.parametrize("status", [Status.TIMEOUT, Status.OOM, Status.INTEGRITY_VIOLATION])
def test_reward_for_policy_failures_is_zero(status: Status) -> None:
    assert reward_for(status, 0.75) == (0.0, False)


@pytest.mark.parametrize("status", [Status.REJECTED, Status.SANDBOX_ERROR, Status.CANCELLED])
def test_reward_for_platform_failures_is_masked(status: Status) -> None:
    assert reward_for(status, 0.75) == (None, True)


def test_reward_rules_cover_every_status() -> None:
    assert set(REWARD_RULES) == set(Status)


def test_ids_with_a_trailing_newline_are_rejected() -> None:
    with pytest.raises(ValidationError, match="no control characters"):
        Sample(task_id="t\n", sample_id="s")
    with pytest.raises(ValidationError, match="request_id must be"):
        ExecutionRequest(request_id="abc\n", task_ref="set@v/t")


def test_cancelled_is_masked_with_no_reward() -> None:
    assert Status("cancelled") is Status.CANCELLED
    rule = REWARD_RULES[Status.CANCELLED]
    assert (rule.scored, rule.fixed, rule.loss_mask) == (False, None, True)
    assert reward_for(Status.CANCELLED, None) == (None, True)


def result(status: Status, reward: float | None, loss_mask: bool) -> ExecutionResult:
    return ExecutionResult(request_id="r1", status=status, reward=reward, loss_mask=loss_mask)


@pytest.mark.parametrize(
    ("status", "reward", "loss_mask", "learnable"),
    [
        (Status.SUCCEEDED, 0.75, False, 0.75),
        (Status.SUCCEEDED, 0.0, False, 0.0),
        (Status.TIMEOUT, 0.0, False, 0.0),  # a policy failure is a reward, not None
        (Status.SANDBOX_ERROR, None, True, None),
        (Status.CANCELLED, None, True, None),
        (Status.REJECTED, None, True, None),
        (Status.SUCCEEDED, 0.75, True, None),  # a masked sample is never learned from
    ],
)
def test_reward_or_none_is_none_whenever_the_loss_is_masked(
    status: Status, reward: float | None, loss_mask: bool, learnable: float | None
) -> None:
    assert result(status, reward, loss_mask).reward_or_none == learnable


def test_reward_or_none_follows_the_reward_rules() -> None:
    for status in Status:
        reward, loss_mask = reward_for(status, 0.5)
        expected = None if REWARD_RULES[status].loss_mask else reward
        assert result(status, reward, loss_mask).reward_or_none == expected


REFUSED_REQUEST_FIELDS = [
    ("priority", "high", "every request runs at normal priority; remove the field"),
    (
        "reply_to",
        "https://sqs.us-east-1.amazonaws.com/0/replies",
        "results are read from the executions table (Client.as_completed / gather)",
    ),
    ("episode_id", "e1", EPISODES),
    ("turn", 2, EPISODES),
]


def test_a_base_checkpoint_is_a_sha256_and_anything_else_is_refused() -> None:
    body = {"request_id": "r1", "task_ref": "s@v/t", "checkpoint": True}
    good = ExecutionRequest.model_validate(body | {"base_checkpoint": "ab" * 32})
    assert (good.base_checkpoint, good.checkpoint) == ("ab" * 32, True)
    for bad in ("s3://bucket/checkpoints/c1.tar", "AB" * 32, "ab" * 31, "../" + "a" * 61):
        with pytest.raises(ValidationError) as exc:
            ExecutionRequest.model_validate(body | {"base_checkpoint": bad})
        assert errors(exc)[0][0] == ("base_checkpoint",)


@pytest.mark.parametrize(("field", "value", "reason"), REFUSED_REQUEST_FIELDS)
def test_an_unsupported_request_field_is_refused_with_its_reason(
    field: str, value: object, reason: str
) -> None:
    for given in (value, None):  # null too: the reason, never "Extra inputs are not permitted"
        with pytest.raises(ValidationError) as exc:
            ExecutionRequest.model_validate({"request_id": "r1", "task_ref": "s@v/t", field: given})
        assert errors(exc) == [((), f"Value error, {field} is not supported yet: {reason}")]
    assert field not in ExecutionRequest.model_fields


def test_an_inline_task_naming_an_image_is_refused_with_its_reason() -> None:
    reason = (
        "image is not supported yet: every task runs in the pool's sandbox image; remove the field"
    )
    with pytest.raises(ValidationError) as exc:
        make_task(image="python:3.12")
    assert errors(exc) == [((), f"Value error, {reason}")]
    task = {"task_id": "t", "hidden_tests": HIDDEN, "grading": GRADING, "image": "python:3.12"}
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest.model_validate({"request_id": "r1", "task": task})
    assert errors(exc) == [(("task",), f"Value error, {reason}")]
    assert "image" not in Task.model_fields


def request(**fields: object) -> ExecutionRequest:
    return ExecutionRequest.model_validate(
        {
            "request_id": "r1",
            "task_ref": "set@v1/t",
            "files": {"solution.py": "def add(a, b):\n    return a + b\n"},
            "commands": [["python", "solution.py"]],
        }
        | fields
    )


def test_content_sha256_is_equal_for_equal_content() -> None:
    digest = request().content_sha256()
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert request().content_sha256() == digest
    # The same content however it was written: key order, defaults spelt out, a JSON trip.
    spelt_out = request(grade=True, tags={}, metadata=None, limits={}, schema_version=1)
    assert spelt_out.content_sha256() == digest
    reordered = ExecutionRequest.model_validate(
        dict(reversed(list(request().model_dump().items())))
    )
    assert reordered.content_sha256() == digest
    assert (
        ExecutionRequest.model_validate_json(request().model_dump_json()).content_sha256() == digest
    )


@pytest.mark.parametrize(
    "change",
    [
        {"files": {"solution.py": "def add(a, b):\n    return a - b\n"}},  # a file changed
        {"files": {"solution.py": "def add(a, b):\n    return a + b\n", "x.py": ""}},
        {"files": {"other.py": "def add(a, b):\n    return a + b\n"}},  # a file renamed
        {"commands": [["python", "other.py"]]},
        {"task_ref": "set@v2/t"},
        {"limits": {"timeout_s": 5}},
        {"grade": False},
    ],
)
def test_content_sha256_differs_when_the_content_does(change: dict[str, object]) -> None:
    assert request(**change).content_sha256() != request().content_sha256()
