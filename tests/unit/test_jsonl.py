"""tasks.jsonl and samples.jsonl: load fully, or report every bad line with file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trialbox.errors import InputError, InvalidInputFiles, LineError
from trialbox.models.jsonl import load_tasks_and_samples

TASK_LINE = (
    '{"task_id": "add-two", "prompt": "Write add(a, b) in solution.py", "workspace": '
    '{"solution.py": "def add(a, b):\\n    raise NotImplementedError\\n"}, "hidden_tests": '
    '{"tests/test_add.py": "from solution import add\\ndef test_small():\\n    assert add(1, 2) '
    '== 3\\n"}, "grading": {"command": ["python", "-m", "pytest", "-q", "tests"], "scorer": '
    '"tests_pass_fraction", "expected_tests": ["tests/test_add.py::test_small"]}, "limits": '
    '{"timeout_s": 10, "memory_mb": 512}, "reference": {"solution.py": "def add(a, b):\\n    '
    'return a + b\\n"}}'
)
SAMPLE_LINE = (
    '{"task_id": "add-two", "sample_id": "s1", "files": {"solution.py": "def add(a, b):\\n    '
    'return a + b\\n"}}'
)
TASK = json.loads(TASK_LINE)


def write(tmp_path: Path, tasks: list[str], samples: list[str]) -> tuple[Path, Path]:
    tasks_path, samples_path = tmp_path / "tasks.jsonl", tmp_path / "samples.jsonl"
    tasks_path.write_text("\n".join(tasks) + "\n")
    samples_path.write_text("\n".join(samples) + "\n")
    return tasks_path, samples_path


def task(**fields: object) -> str:
    return json.dumps(TASK | fields)


def test_loads_the_public_example(tmp_path: Path) -> None:
    tasks, samples, _ = load_tasks_and_samples(*write(tmp_path, [TASK_LINE], [SAMPLE_LINE]))
    [loaded] = tasks
    assert loaded.task_id == "add-two"
    assert loaded.workspace == {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"}
    assert loaded.grading.command == ["python", "-m", "pytest", "-q", "tests"]
    assert loaded.grading.expected_tests == ["tests/test_add.py::test_small"]
    limits = loaded.limits
    assert (limits.timeout_s, limits.memory_mb, limits.disk_mb) == (10.0, 512, 64)
    assert loaded.reference == {"solution.py": "def add(a, b):\n    return a + b\n"}
    [sample] = samples
    assert (sample.task_id, sample.sample_id) == ("add-two", "s1")
    assert sample.files == {"solution.py": "def add(a, b):\n    return a + b\n"}


def test_every_error_is_listed_with_file_line_and_field(tmp_path: Path) -> None:
    tasks = [
        TASK_LINE,
        "{bad",
        "[1, 2]",
        task(task_id="t-bogus", bogus=1),
        task(task_id="t-up", workspace={"../x": "a"}),
        task(task_id="t-abs", workspace={"/etc/passwd": "a"}),
        task(task_id="t-mem0", limits={"memory_mb": 0}),
        task(task_id="t-memhuge", limits={"memory_mb": 10**9}),
        TASK_LINE,
    ]
    samples = [
        SAMPLE_LINE,
        '{"task_id": "add-two"}',
        SAMPLE_LINE,
        '{"task_id": "ghost", "sample_id": "s2"}',
    ]
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, tasks, samples))
    component = "has an empty, '.' or '..' component; it must stay inside the workspace"
    expected = [
        "tasks.jsonl:2: bad JSON: Expecting property name enclosed in double quotes at column 2",
        "tasks.jsonl:3: each line must be a JSON object",
        "tasks.jsonl:4: bogus: unknown field (put free-form data under 'metadata')",
        f"tasks.jsonl:5: workspace[\"../x\"]: path '../x' {component}",
        'tasks.jsonl:6: workspace["/etc/passwd"]: '
        "path '/etc/passwd' is absolute; "
        "paths are relative to the workspace",
        "tasks.jsonl:7: limits.memory_mb: Input should be greater than or equal to 32",
        "tasks.jsonl:8: limits.memory_mb: Input should be less than or equal to 65536",
        "tasks.jsonl:9: task_id: duplicate task_id 'add-two' (first on line 1)",
        "samples.jsonl:2: sample_id: Field required",
        "samples.jsonl:3: sample_id: duplicate (task_id, sample_id) ('add-two', 's1') "
        "(first on line 1)",
        "samples.jsonl:4: task_id: task 'ghost' is not in tasks.jsonl",
    ]
    assert [str(error) for error in exc.value.errors] == expected
    assert str(exc.value) == "11 error(s) in 11 place(s); nothing was run:\n" + "\n".join(
        f"  {line}" for line in expected
    )
    assert exc.value.errors[5] == LineError(
        "tasks.jsonl", 7, "limits.memory_mb", "Input should be greater than or equal to 32"
    )
    assert isinstance(exc.value, InputError)


def test_blank_lines_are_skipped_and_numbered(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, [TASK_LINE, "", "   ", "{bad"], [SAMPLE_LINE]))
    assert [str(e) for e in exc.value.errors] == [
        "tasks.jsonl:4: bad JSON: Expecting property name enclosed in double quotes at column 2"
    ]


def test_empty_file_has_no_records(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, [TASK_LINE], [""]))
    assert [str(e) for e in exc.value.errors] == ["samples.jsonl: the file has no records"]


def test_a_missing_or_unreadable_file_does_not_stop_the_other_being_checked(
    tmp_path: Path,
) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "add-two"}\n')
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(tmp_path / "nope.jsonl", samples)
    assert [str(e) for e in exc.value.errors] == [
        f"{tmp_path / 'nope.jsonl'}: no such file",
        "samples.jsonl:1: sample_id: Field required",
    ]
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(tmp_path, samples)
    assert str(exc.value.errors[0]) == f"{tmp_path}: is a directory, not a JSONL file"


def test_not_utf8_names_line_and_column(tmp_path: Path) -> None:
    tasks, samples = write(tmp_path, [TASK_LINE], [SAMPLE_LINE])
    samples.write_bytes(SAMPLE_LINE.encode() + b'\n{"task_id": "\xff"}\n')
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(tasks, samples)
    assert [str(e) for e in exc.value.errors] == [
        "samples.jsonl:2: not UTF-8 text (invalid start byte at column 14)"
    ]


def test_empty_samples_are_reported_beside_task_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, ["{bad"], [""]))
    assert [str(e) for e in exc.value.errors] == [
        "tasks.jsonl:1: bad JSON: Expecting property name enclosed in double quotes at column 2",
        "samples.jsonl: the file has no records",
    ]


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    tasks, samples = write(tmp_path, [TASK_LINE], [SAMPLE_LINE])
    samples.write_bytes(b"\xef\xbb\xbf" + samples.read_bytes())
    assert len(load_tasks_and_samples(tasks, samples)[1]) == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            '{"task_id": "add-two", "sample_id": "s", "sample_id": "t"}',
            "bad JSON: duplicate key 'sample_id'",
        ),
        (
            '{"task_id": "add-two", "sample_id": "s", "metadata": {"x": NaN}}',
            "bad JSON: NaN is not a JSON number",
        ),
    ],
)
def test_ambiguous_json_is_an_error(tmp_path: Path, line: str, reason: str) -> None:
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, [TASK_LINE], [line]))
    assert [str(e) for e in exc.value.errors] == [f"samples.jsonl:1: {reason}"]


def test_file_content_errors_name_the_file_not_pydantic_internals(tmp_path: Path) -> None:
    samples = [
        '{"task_id": "add-two", "sample_id": "a", "files": {"a.py": 5}}',
        '{"task_id": "add-two", "sample_id": "b", "files": {"a.py": {"base64": "aGk=", '
        '"mode": "4755"}}}',
    ]
    tasks = [TASK_LINE, task(task_id="t2", limits={"memory": 5})]
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, tasks, samples))
    assert [str(e) for e in exc.value.errors] == [
        "tasks.jsonl:2: limits.memory: unknown field",
        'samples.jsonl:1: files["a.py"]: a file is a text string, or an object '
        '{"base64": "...", "mode": "0644"}',
        "samples.jsonl:2: files[\"a.py\"].mode: mode '4755' is not a permission such as "
        '"0644" or "0755" (three octal digits; setuid, setgid and sticky bits are not allowed)',
    ]


def test_unicode_line_separators_inside_strings_are_not_record_breaks(tmp_path: Path) -> None:
    task = json.loads(TASK_LINE) | {"prompt": "a\u2028b\u0085c"}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task, ensure_ascii=False) + "\n", encoding="utf-8")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(SAMPLE_LINE + "\n")
    loaded, _, _ = load_tasks_and_samples(tasks, samples)
    assert loaded[0].prompt == "a\u2028b\u0085c"


def test_a_file_named_like_a_union_member_is_still_reported(tmp_path: Path) -> None:
    samples = ['{"task_id": "add-two", "sample_id": "s", "files": {"str": 5}}']
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, [TASK_LINE], samples))
    assert [str(e) for e in exc.value.errors] == [
        "samples.jsonl:1: files.str: a file is a text string, or an object "
        '{"base64": "...", "mode": "0644"}'
    ]


def test_an_unreadable_tasks_file_does_not_blame_every_sample(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(SAMPLE_LINE + "\n" + SAMPLE_LINE.replace('"s1"', '"s2"') + "\n")
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(tmp_path / "nope.jsonl", samples)
    assert [str(e) for e in exc.value.errors] == [f"{tmp_path / 'nope.jsonl'}: no such file"]


IMAGE_REASON = "every task runs in the pool's sandbox image; remove the field"


@pytest.mark.parametrize("image", ["python:3.12", None])
def test_a_task_naming_an_image_is_refused_with_the_reason(
    tmp_path: Path, image: str | None
) -> None:
    tasks = [TASK_LINE, task(task_id="t-image", image=image)]
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, tasks, [SAMPLE_LINE]))
    # The message names the field itself: no "(record)" placeholder, no "unknown field".
    assert [str(e) for e in exc.value.errors] == [
        f"tasks.jsonl:2: image is not supported yet: {IMAGE_REASON}"
    ]
    assert exc.value.errors[0] == LineError(
        "tasks.jsonl", 2, None, f"image is not supported yet: {IMAGE_REASON}"
    )


def test_a_whole_record_error_reads_as_one_sentence(tmp_path: Path) -> None:
    grading = TASK["grading"] | {"expected_tests": ["solution.py::test_small"]}
    with pytest.raises(InvalidInputFiles) as exc:
        load_tasks_and_samples(*write(tmp_path, [TASK_LINE, task(grading=grading)], [SAMPLE_LINE]))
    assert [str(e) for e in exc.value.errors] == [
        "tasks.jsonl:2: expected test 'solution.py::test_small' is not in a hidden_tests file "
        "(tests/test_add.py)"
    ]


def test_what_a_policy_wrote_makes_its_sample_ungradable_not_the_file_invalid(
    tmp_path: Path,
) -> None:
    # Was a break: one sample with a path out of the workspace (or text that is not valid
    # Unicode) stopped the whole file: "nothing was run" for every sample.
    samples = [
        SAMPLE_LINE,
        '{"task_id": "add-two", "sample_id": "up", "files": {"../up.py": "x"}}',
        '{"task_id": "add-two", "sample_id": "sur", "files": {"solution.py": "\\ud83d"}}',
        '{"task_id": "add-two", "sample_id": "nul", "commands": [["echo", "a\\u0000b"]]}',
    ]
    _, loaded, ungradable = load_tasks_and_samples(*write(tmp_path, [TASK_LINE], samples))
    assert [s.sample_id for s in loaded] == ["s1", "up", "sur", "nul"]
    assert sorted(ungradable) == [("add-two", "nul"), ("add-two", "sur"), ("add-two", "up")]
    assert "must stay inside the workspace" in ungradable[("add-two", "up")]
    assert loaded[1].files == {} and loaded[3].commands == []
