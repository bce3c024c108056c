"""The grading phase against reward hacks: each asserts the exact reward and outcome."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

from tests.support.sandbox import Grade
from tests.support.tasks import ADD_TASK, CORRECT, FORCE_PASS_CONFTEST
from trialbox.models import Sample, Status, Task
from trialbox.sandbox.runner import Runner
from trialbox.scoring import score

WRONG = "def add(a, b):\n    return 3\n"


def outcomes(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {t.test_id: t.outcome.value for t in result.tests}


def test_correct_sample_scores_one(grade: Grade) -> None:
    report, result = grade({"solution.py": CORRECT})
    assert (result.status, result.reward, result.loss_mask) == (Status.SUCCEEDED, 1.0, False)
    assert (result.tests_passed, result.tests_expected) == (2, 2)
    assert result.feedback == "all 2 tests passed"
    assert report.grading is not None and report.grading.anomalies == []
    assert report.grading.command[:4] == ["python", "-P", "-m", "pytest"]
    assert report.provenance is not None and report.provenance.backend == "bwrap"


def test_wrong_sample_gets_partial_reward_and_feedback(grade: Grade) -> None:
    _, result = grade({"solution.py": WRONG})
    assert result.reward == 0.5
    assert outcomes(result) == {
        "tests/test_add.py::test_small": "passed",
        "tests/test_add.py::test_negative": "failed",
    }
    assert "FAILED tests/test_add.py::test_negative: assert 3 == -3" in result.feedback


def test_syntax_error_scores_zero_with_the_error_in_feedback(grade: Grade) -> None:
    _, result = grade({"solution.py": "def add(a, b)\n    return a + b\n"})
    assert result.reward == 0.0 and result.status == Status.SUCCEEDED
    assert outcomes(result)["tests/test_add.py::test_small"] == "missing"
    assert "SyntaxError" in result.feedback


def test_os_exit_at_import_scores_zero_because_tests_are_missing(grade: Grade) -> None:
    exits = {"solution.py": "import os\nos._exit(0)\n"}
    assert grade(exits)[1].reward == 0.0  # the boundary: only the solution's process exits
    report, result = grade(exits, isolation="in_process")
    assert result.reward == 0.0
    assert set(outcomes(result).values()) == {"missing"}
    assert report.grading is not None
    assert any(a.startswith("session_incomplete") for a in report.grading.anomalies)


def test_module_level_skip_cannot_pass(grade: Grade) -> None:
    files = {"solution.py": "import pytest\npytest.skip('nope', allow_module_level=True)\n"}
    assert grade(files)[1].reward == 0.0
    _, result = grade(files, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0)
    assert "integrity:framework_tampered" in result.flags  # the skip came from the solution
    assert set(outcomes(result).values()) <= {"missing", "skipped", "error"}


def test_editing_or_deleting_hidden_tests_in_the_agent_phase_has_no_effect(grade: Grade) -> None:
    commands = [
        ["sh", "-c", "mkdir -p tests && echo 'def test_small(): pass' > tests/test_add.py"],
        ["sh", "-c", "echo 'def test_negative(): pass' >> tests/test_add.py"],
    ]
    _, edited = grade({"solution.py": WRONG}, commands)
    assert edited.reward == 0.5
    _, deleted = grade({"solution.py": WRONG}, [["rm", "-rf", "tests"]])
    assert deleted.reward == 0.5


def test_planted_conftest_at_root_and_in_tests_is_neutralized(grade: Grade) -> None:
    files = {
        "solution.py": WRONG,
        "conftest.py": FORCE_PASS_CONFTEST,
        "tests/conftest.py": FORCE_PASS_CONFTEST,
    }
    assert grade(files)[1].reward == 0.5
    report, result = grade(files, isolation="in_process")
    assert result.reward == 0.5
    assert report.grading is not None
    paths = {n.path for n in report.grading.neutralized}
    assert {"conftest.py", "tests/conftest.py"} <= paths
    assert "neutralized_files" in result.flags


def test_pytest_ini_that_collects_nothing_is_neutralized(grade: Grade) -> None:
    files = {
        "solution.py": CORRECT,
        "pytest.ini": "[pytest]\npython_files = nothing_*.py\naddopts = --co\n",
        "setup.cfg": "[tool:pytest]\npython_files = nothing_*.py\n",
        "pyproject.toml": "[tool.pytest.ini_options]\npython_files = ['nothing_*.py']\n",
    }
    report, result = grade(files)
    assert result.reward == 1.0
    assert report.grading is not None
    assert "pytest.ini" in {n.path for n in report.grading.neutralized}


def test_planted_pytest_module_is_neutralized(grade: Grade) -> None:
    files = {"solution.py": WRONG, "pytest.py": "import sys\nsys.exit(0)\n"}
    assert grade(files)[1].reward == 0.5
    report, result = grade(files, isolation="in_process")
    assert result.reward == 0.5
    assert report.grading is not None
    assert {"path": "pytest.py", "reason": "shadows the module 'pytest'"} in [
        n.model_dump() for n in report.grading.neutralized
    ]


def test_shadowing_stdlib_module_and_pyc_files_are_neutralized(grade: Grade) -> None:
    files = {
        "solution.py": CORRECT,
        "tests/json.py": "raise SystemExit(0)\n",
        "__pycache__/solution.cpython-311.pyc": {"base64": base64.b64encode(b"junk").decode()},
        "sitecustomize.py": "import os; os._exit(0)\n",
    }
    assert grade(files)[1].reward == 1.0
    report, result = grade(files, isolation="in_process")
    assert result.reward == 1.0
    assert report.grading is not None
    assert {n.path for n in report.grading.neutralized} == {
        "tests/json.py",
        "__pycache__",
        "sitecustomize.py",
    }


def test_symlink_to_etc_leads_to_no_host_read_or_write(grade: Grade, tmp_path: Path) -> None:
    commands = [
        ["ln", "-s", "/etc", "tests"],
        ["ln", "-s", "/etc/shadow", "stolen.txt"],
        ["ln", "-s", "/etc/hostname", "solution_data.txt"],
    ]
    report, result = grade({"solution.py": CORRECT}, commands)
    assert result.reward == 1.0
    assert not Path("/etc/test_add.py").exists()
    assert report.grading is not None
    reasons = {n.path: n.reason for n in report.grading.neutralized}
    assert reasons["stolen.txt"].startswith("symlink")
    assert reasons["tests"].startswith("symlink")


def test_checkpoint_stores_links_without_following_them(runner: Runner, tmp_path: Path) -> None:
    task = Task.model_validate(ADD_TASK)
    sample = Sample(
        task_id=task.task_id,
        sample_id="ckpt",
        files={"solution.py": CORRECT},
        commands=[["ln", "-s", "/etc/shadow", "stolen.txt"]],
    )
    target = tmp_path / "ckpt.tar.gz"
    runner.run(task, sample, checkpoint_to=target)
    with tarfile.open(fileobj=io.BytesIO(target.read_bytes())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["stolen.txt"].issym() and members["stolen.txt"].linkname == "/etc/shadow"
    assert members["solution.py"].isfile()


def test_a_restored_checkpoint_keeps_its_links_as_links_and_grading_ignores_them(
    runner: Runner, tmp_path: Path
) -> None:
    """Turn 1 plants a link to a secret and a link where the tests go; turn 2, restored from
    that checkpoint, reads nothing through them and is graded as usual."""
    task = Task.model_validate(ADD_TASK)
    plant = [["sh", "-c", "ln -s /etc/shadow stolen.txt && ln -s /etc tests"]]
    first = Sample(task_id=task.task_id, sample_id="t1", files={}, commands=plant)
    saved = tmp_path / "t1.tar.gz"
    runner.run(task, first, grade=False, checkpoint_to=saved)
    second = Sample(
        task_id=task.task_id,
        sample_id="t2",
        files={"solution.py": CORRECT},
        commands=[["sh", "-c", "readlink stolen.txt; cat stolen.txt"]],
    )
    report = runner.run(task, second, base_checkpoint=saved.read_bytes())
    (agent, _) = report.commands
    assert agent.stdout == "/etc/shadow\n" and agent.exit_code != 0  # no shadow in the sandbox
    assert score(task.grading, report).reward == 1.0


def test_a_checkpoint_larger_than_the_workspace_is_the_policys_failure(
    runner: Runner, tmp_path: Path
) -> None:
    task = Task.model_validate(ADD_TASK)
    big = ["python", "-c", "open('blob', 'wb').write(bytes(3 << 20))"]
    first = Sample(task_id=task.task_id, sample_id="big", files={}, commands=[big])
    saved = tmp_path / "big.tar.gz"
    runner.run(task, first, grade=False, checkpoint_to=saved)
    tight = task.limits.model_copy(update={"disk_mb": 2})
    second = Sample(task_id=task.task_id, sample_id="tight", files={"solution.py": CORRECT})
    report = runner.run(task, second, limits=tight, base_checkpoint=saved.read_bytes())
    assert report.status == Status.SUCCEEDED and not report.commands
    assert any("do not fit the 2 MiB workspace" in note for note in report.notes)
    assert score(task.grading, report).reward == 0.0


def test_agent_command_results_are_reported_and_do_not_skip_grading(grade: Grade) -> None:
    report, result = grade(
        {"solution.py": CORRECT}, [["sh", "-c", "echo out; echo err >&2; exit 4"]]
    )
    agent = report.commands[0]
    assert (agent.phase, agent.exit_code, agent.stdout, agent.stderr) == (
        "agent",
        4,
        "out\n",
        "err\n",
    )
    assert result.reward == 1.0


def test_agent_timeout_still_grades_and_status_is_the_grading_phases(grade: Grade) -> None:
    report, result = grade(
        {"solution.py": CORRECT},
        [["python", "-c", "while True: pass"]],
        limits={"timeout_s": 1, "memory_mb": 256},
        grading=ADD_TASK["grading"] | {"timeout_s": 10},
    )
    assert report.commands[0].status == Status.TIMEOUT
    assert result.status == Status.SUCCEEDED and result.reward == 1.0


def test_grading_timeout_is_a_timeout_with_zero_reward(grade: Grade) -> None:
    _, result = grade(
        {"solution.py": "def add(a, b):\n    while True:\n        pass\n"},
        limits={"timeout_s": 1, "memory_mb": 256},
    )
    assert (result.status, result.reward, result.loss_mask) == (Status.TIMEOUT, 0.0, False)
    # Whichever comes first on a loaded machine: the sandbox's kill at 1 s from the start, or
    # the boundary's deadline for the solution's code (0.8 s from the grader's start).
    assert result.feedback in (
        "grading timed out after 1 s",
        "grading: the solution's code did not finish within 1 s",
    )


def test_a_grader_that_never_ends_is_stopped_by_the_sandbox(grade: Grade) -> None:
    """The hidden test itself loops (no solution code runs): only the sandbox's kill can end it."""
    hidden = {"tests/test_add.py": "def test_small():\n    while True:\n        pass\n"}
    _, result = grade(
        {"solution.py": CORRECT}, hidden_tests=hidden, limits={"timeout_s": 1, "memory_mb": 256}
    )
    assert (result.status, result.reward, result.loss_mask) == (Status.TIMEOUT, 0.0, False)
    assert result.feedback == "grading timed out after 1 s"


def test_grading_memory_hog_is_oom(grade: Grade) -> None:
    hog = "def add(a, b):\n    x = [bytearray(1 << 20) for _ in range(4096)]\n    return a + b\n"
    _, result = grade({"solution.py": hog}, limits={"memory_mb": 128})
    assert (result.status, result.reward) == (Status.OOM, 0.0)
    assert result.feedback == "grading killed: memory limit 128 MiB"


def test_the_agents_own_test_modules_never_run_at_grading(grade: Grade) -> None:
    """Collected beside the hidden tests and before them, an agent's test module could stub
    them out (a meta_path hook, a planted sys.modules entry): it stays out of the tree."""
    stub = (
        "import sys, types\n"
        "fake = types.ModuleType('test_add')\n"
        "fake.test_small = fake.test_negative = lambda: None\n"
        "sys.modules['test_add'] = sys.modules['tests.test_add'] = fake\n"
        "def test_free():\n    pass\n"
    )
    files = {"solution.py": WRONG, "tests/test_000.py": stub, "checks/mine_test.py": stub}
    assert grade(files)[1].reward == 0.5
    report, result = grade(files, isolation="in_process")
    assert result.reward == 0.5
    assert not [t for t in outcomes(result) if "test_free" in t]
    assert report.grading is not None
    left_out = {n.path for n in report.grading.neutralized}
    assert {"tests/test_000.py", "checks/mine_test.py"} <= left_out


def test_null_expected_tests_count_only_hidden_collected_tests(grade: Grade) -> None:
    grading = ADD_TASK["grading"] | {"expected_tests": None}
    files = {"solution.py": WRONG, "tests/test_mine.py": "def test_free():\n    pass\n"}
    _, result = grade(files, grading=grading)
    assert (result.tests_passed, result.tests_expected, result.reward) == (1, 2, 0.5)
    assert "expected_tests_unknown" in result.flags


def test_all_or_nothing(grade: Grade) -> None:
    grading = ADD_TASK["grading"] | {"scorer": "all_or_nothing"}
    assert grade({"solution.py": WRONG}, grading=grading)[1].reward == 0.0
    assert grade({"solution.py": CORRECT}, grading=grading)[1].reward == 1.0


def test_xfail_skip_and_error_do_not_count(grade: Grade) -> None:
    hidden = {
        "tests/test_add.py": (
            "import pytest\nfrom solution import add\n"
            "def test_small():\n    assert add(1, 2) == 3\n"
            "@pytest.mark.xfail\ndef test_negative():\n    assert add(-1, -2) == -3\n"
            "@pytest.mark.skip\ndef test_skip():\n    pass\n"
            "@pytest.fixture\ndef broken():\n    raise RuntimeError('x')\n"
            "def test_error(broken):\n    pass\n"
        )
    }
    grading = ADD_TASK["grading"] | {
        "expected_tests": [
            "tests/test_add.py::test_small",
            "tests/test_add.py::test_negative",
            "tests/test_add.py::test_skip",
            "tests/test_add.py::test_error",
        ]
    }
    _, result = grade({"solution.py": CORRECT}, hidden_tests=hidden, grading=grading)
    assert outcomes(result) == {
        "tests/test_add.py::test_small": "passed",
        "tests/test_add.py::test_negative": "xpassed",
        "tests/test_add.py::test_skip": "skipped",
        "tests/test_add.py::test_error": "error",
    }
    assert result.reward == 0.25


def test_files_that_overflow_the_workspace_score_zero_and_are_not_masked(grade: Grade) -> None:
    """Padding a sample past its disk limit must not turn a wrong answer into a masked
    sandbox_error: the policy's overflow is its own failure."""
    padding = "x" * (20 * 1024 * 1024)
    report, result = grade(
        {"solution.py": WRONG, "pad.txt": padding},
        commands=[["python", "-c", "open('ran', 'w').write('1')"]],
        limits={"disk_mb": 16, "memory_mb": 256},
    )
    assert (result.status, result.reward, result.loss_mask) == (Status.SUCCEEDED, 0.0, False)
    assert report.commands == []  # nothing ran
    assert set(outcomes(result).values()) == {"missing"}
    assert result.feedback == (
        "reward 0: the sample's files do not fit the 16 MiB workspace; nothing ran"
    )


def test_starter_plus_sample_files_past_the_cap_are_the_samples_overflow(runner: Runner) -> None:
    """Each file fits, together they do not: the tmpfs says ENOSPC, and an ungraded run says
    why nothing ran."""
    ten_mib = "x" * (10 * 1024 * 1024)
    task = Task.model_validate(
        ADD_TASK | {"workspace": {"data.txt": ten_mib}, "limits": {"disk_mb": 16, "memory_mb": 256}}
    )
    sample = Sample(task_id=task.task_id, sample_id="s", files={"more.txt": ten_mib})
    report = runner.run(task, sample, grade=False)
    assert (report.status, report.grading, report.commands) == (Status.SUCCEEDED, None, [])
    assert report.notes[-1] == "the sample's files do not fit the 16 MiB workspace; nothing ran"
    graded = score(task.grading, runner.run(task, sample))
    assert (graded.status, graded.reward, graded.loss_mask) == (Status.SUCCEEDED, 0.0, False)


def test_a_starter_file_the_sample_replaces_is_never_written(runner: Runner) -> None:
    """The sample's own solution.py replaces the starter's, which is not written first: a
    starter of 24 MiB in a 16 MiB workspace no longer fails a sample that rewrites it (before,
    the starter's write overflowed the workspace: a sandbox error, masked), and a starter file
    the sample does not replace is still there."""
    task = Task.model_validate(
        ADD_TASK
        | {
            "workspace": {"solution.py": "x" * (24 << 20), "notes.txt": "kept\n"},
            "limits": {"disk_mb": 16, "memory_mb": 256},
        }
    )
    sample = Sample(task_id=task.task_id, sample_id="s", files={"solution.py": CORRECT})
    sample = sample.model_copy(update={"commands": [["cat", "notes.txt"]]})
    report = runner.run(task, sample)
    result = score(task.grading, report)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.feedback
    assert report.commands[0].stdout == "kept\n"


def test_in_process_imports_only_the_starters_modules(grade: Grade) -> None:
    """Under the boundary the solution's own process imports whatever it wrote; in process,
    only the starter's module names are importable, from a directory without tests."""
    files = {"solution.py": "from helpers import add\n", "helpers.py": CORRECT}
    assert grade(files)[1].reward == 1.0
    report, result = grade(files, isolation="in_process")
    assert result.reward == 0.0
    assert report.grading is not None
    assert "No module named 'helpers'" in str([t.message for t in report.grading.tests])
    assert grade({"solution.py": CORRECT}, isolation="in_process")[1].reward == 1.0


def test_an_error_in_the_solution_carries_its_own_frames_and_a_probe_costs_none(
    grade: Grade,
) -> None:
    raises = (
        "def add(a, b):\n    return _check(a)\n\ndef _check(a):\n    raise ValueError(f'no {a}')\n"
    )
    hidden = {
        "tests/test_add.py": (
            "import solution\nfrom solution import add\n"
            "def test_small():\n    assert add(1, 2) == 3\n"
            "def test_negative():\n"
            "    assert not hasattr(solution, 'nope')\n"
            "    try:\n        solution.nope\n"
            "    except AttributeError as exc:\n"
            "        assert not getattr(exc, '__notes__', None)\n"
        )
    }
    _, result = grade({"solution.py": raises}, hidden_tests=hidden)
    assert outcomes(result) == {
        "tests/test_add.py::test_small": "failed",
        "tests/test_add.py::test_negative": "passed",
    }
    message = next(t.message for t in result.tests if t.test_id.endswith("test_small"))
    assert message is not None
    assert "ValueError: no 1" in message and "_check" in message and "solution.py" in message


def test_after_the_solutions_process_dies_the_next_test_gets_one_that_ran_nothing(
    grade: Grade,
) -> None:
    # The spare the zygote forks ahead of time must start like one forked on demand.
    dies_once = (
        "import os\nSEEN = []\n"
        "def add(a, b):\n"
        "    SEEN.append((a, b))\n"
        "    if (a, b) == (1, 2):\n        os._exit(3)\n"
        "    return a + b if len(SEEN) == 1 else 0\n"
    )
    _, result = grade({"solution.py": dies_once})
    assert outcomes(result) == {
        "tests/test_add.py::test_small": "failed",
        "tests/test_add.py::test_negative": "passed",
    }
    assert result.reward == 0.5


def test_not_equal_to_a_value_without_a_decoy_is_not_the_solutions_free_pass(
    grade: Grade,
) -> None:
    # Was a break: `!=` negated `==`'s NotImplemented (no decoy for a Decimal, an array or a
    # test's own object), so `handle != expected` was False without asking anything.
    hidden = {
        "tests/test_add.py": (
            "from decimal import Decimal\nfrom solution import add\n"
            "def test_small():\n"
            "    if add(1, 2) != Decimal('3'):\n        raise AssertionError('wrong')\n"
            "def test_negative():\n    assert not (add(-1, -2) != object())\n"
        )
    }
    nothing = "class Nothing:\n    pass\ndef add(a, b):\n    return Nothing()\n"
    _, result = grade({"solution.py": nothing}, hidden_tests=hidden)
    assert result.reward == 0.0
    assert set(outcomes(result).values()) == {"failed"}
