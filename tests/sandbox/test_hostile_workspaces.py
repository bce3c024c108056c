"""Workspaces built to fool or break the grader (found in review): each gets a fair score,
never a `sandbox_error` (which would mask it from the trainer), and never a crash."""

from __future__ import annotations

import re
import resource

import pytest

from tests.support.sandbox import Grade
from tests.support.tasks import CORRECT
from trialbox.models import Status

WRONG = "def add(a, b):\n    return 3\n"
FORCE_PASS = (
    "import pytest\n"
    "@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)


def test_entry_point_plugin_in_a_planted_dist_info_does_not_load(grade: Grade) -> None:
    files = {
        "solution.py": WRONG,
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplug\n",
        "evilplug.py": FORCE_PASS,
    }
    report, result = grade(files)
    assert result.reward == 0.5
    assert report.grading is not None
    assert "evil-1.0.dist-info" in {n.path for n in report.grading.neutralized}


def test_patching_pytest_reports_from_the_solution_is_detected(grade: Grade) -> None:
    solution = WRONG + (
        "import _pytest.reports as r\n"
        "_orig = r.TestReport.from_item_and_call\n"
        "def forged(item, call):\n"
        "    report = _orig(item, call)\n"
        "    report.outcome = 'passed'\n"
        "    report.longrepr = None\n"
        "    return report\n"
        "r.TestReport.from_item_and_call = staticmethod(forged)\n"
    )
    assert grade({"solution.py": solution})[1].reward < 1.0  # the boundary: out of reach
    report, result = grade({"solution.py": solution}, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0)
    assert "untrusted_report:pytest_tampered" in result.flags
    assert "integrity:framework_tampered" in result.flags
    assert report.grading is not None
    assert any("TestReport.from_item_and_call" in a for a in report.grading.anomalies)


def test_replacing_runtest_from_the_solution_is_detected(grade: Grade) -> None:
    """Found by a red team: every test 'passes' without running its body."""
    solution = (
        WRONG + "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
    )
    assert grade({"solution.py": solution})[1].reward < 1.0  # the boundary: out of reach
    report, result = grade({"solution.py": solution}, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0)
    assert "untrusted_report:pytest_tampered" in result.flags
    assert "integrity:framework_tampered" in result.flags
    assert report.grading is not None
    assert any("Function.runtest" in a for a in report.grading.anomalies)


def test_a_plugin_registered_from_the_solution_is_detected(grade: Grade) -> None:
    """Found by a red team: the plugin manager, found through gc, takes a hookwrapper that
    turns every report into a pass."""
    solution = WRONG + (
        "import gc, pytest\n"
        "class Forge:\n"
        "    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        report = (yield).get_result()\n"
        "        report.outcome, report.longrepr = 'passed', None\n"
        "for found in gc.get_objects():\n"
        "    if type(found).__name__ == 'PytestPluginManager':\n"
        "        found.register(Forge(), 'forge')\n"
        "        break\n"
    )
    assert grade({"solution.py": solution})[1].reward < 1.0  # the boundary: out of reach
    report, result = grade({"solution.py": solution}, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0)
    assert "untrusted_report:pytest_tampered" in result.flags
    assert "integrity:framework_tampered" in result.flags
    assert report.grading is not None
    assert any("forge" in a for a in report.grading.anomalies)


def test_replacing_the_plugins_emitter_changes_nothing(grade: Grade) -> None:
    solution = WRONG + (
        "import sys, json\n"
        "plugin = sys.modules['trialbox_report']\n"
        "real = plugin._EMIT\n"
        "def lie(event):\n"
        "    if event.get('outcome') == 'failed':\n"
        "        event['outcome'] = 'passed'\n"
        "    real(event)\n"
        "plugin._EMIT = lie\n"
    )
    assert grade({"solution.py": solution})[1].reward < 1.0
    _, result = grade({"solution.py": solution}, isolation="in_process")
    assert result.reward == 0.5


def test_paths_colliding_with_hidden_tests_lose_to_them(grade: Grade) -> None:
    for files in (
        {"solution.py": CORRECT, "tests": "a file where the hidden tests go"},
        {"solution.py": CORRECT, "tests/test_add.py/x": "a directory at a hidden test"},
    ):
        _, result = grade(files)
        assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.error


def test_a_workspace_full_of_inodes_still_grades(grade: Grade) -> None:
    commands = [["sh", "-c", "mkdir many && cd many && seq 1 65000 | xargs touch"]]
    _, result = grade({"solution.py": CORRECT}, commands, limits={"timeout_s": 60})
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.feedback


def test_a_huge_sparse_file_is_left_out_without_memory_growth(grade: Grade) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report, result = grade({"solution.py": CORRECT}, [["truncate", "-s", "2G", "big"]])
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0)
    assert report.grading is not None
    reasons = {n.path: n.reason for n in report.grading.neutralized}
    assert reasons["big"] == "2147483648 bytes: larger than the workspace"
    assert grown_mib < 64


def test_a_very_deep_tree_is_cut_off_not_a_crash(grade: Grade) -> None:
    commands = [["sh", "-c", "for i in $(seq 1100); do mkdir d && cd d || exit 1; done"]]
    report, result = grade({"solution.py": CORRECT}, commands, limits={"timeout_s": 30})
    assert (result.status, result.reward) == (Status.SUCCEEDED, 1.0), result.error
    assert report.grading is not None
    assert any("deeper than 64" in n.reason for n in report.grading.neutralized)


def test_undecodable_text_in_messages_and_names_is_replaced(grade: Grade) -> None:
    solution = (
        "def add(a, b):\n"
        "    raise AssertionError(b'bad \\xff'.decode('utf-8', 'surrogateescape'))\n"
    )
    commands = [
        [
            "python",
            "-c",
            "open(b'name-\\xff.txt', 'w').close(); import os; os.symlink('/etc', b'l\\xfe')",
        ]
    ]
    report, result = grade({"solution.py": solution}, commands)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 0.0), result.error
    result.model_dump_json()  # serializable: no lone surrogates left
    assert "bad \ufffd" in result.feedback
    assert report.grading is not None
    assert "l\ufffd" in {n.path for n in report.grading.neutralized}


def test_the_report_nonce_is_in_no_environment_or_argv(grade: Grade) -> None:
    """Read from a descriptor and closed: /proc/self/environ and cmdline never hold it."""
    solution = (
        "def add(a, b):\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        print(name, open(f'/proc/self/{name}', 'rb').read())\n"
        "    return 0\n"
    )
    report, _ = grade({"solution.py": solution}, isolation="in_process")
    shown = report.commands[-1].stdout
    assert "environ b" in shown and "cmdline b" in shown
    assert "TRIALBOX_REPORT_NONCE=" not in shown
    assert not re.search(r"[0-9a-f]{32}", shown)  # the nonce's form: 16 random bytes, hex


READS = {
    # Was a break: the open was watched only in a test's call phase, by str path, as written.
    "at import": "import re\nSRC = open('/workspace/tests/test_add.py').read()\n",
    "by bytes path": (
        "import re\ndef _src():\n    return open(b'/workspace/tests/test_add.py').read().decode()\n"
    ),
    "through /proc/self/cwd": (
        "import re\ndef _src():\n    return open('/proc/self/cwd/tests/test_add.py').read()\n"
    ),
}
ANSWER = (
    "def add(a, b):\n"
    "    src = SRC if 'SRC' in globals() else _src()\n"
    "    for m in re.finditer(r'add\\((.*?)\\) == (.*)', src):\n"
    "        if eval('(' + m.group(1) + ')') == (a, b):\n"
    "            return eval(m.group(2))\n"
)


@pytest.mark.parametrize("how", list(READS))
def test_reading_the_test_file_in_process_is_caught_however_it_is_opened(
    grade: Grade, how: str
) -> None:
    _, result = grade({"solution.py": READS[how] + ANSWER}, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0), result.feedback
    assert "integrity:test_source_read" in result.flags


def test_an_object_equal_to_anything_is_caught_in_process_too(grade: Grade) -> None:
    # Was a break: the always_equal check lived only at the boundary.
    rigged = (
        "class Any:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Any()\n"
    )
    _, result = grade({"solution.py": rigged}, isolation="in_process")
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0)
    assert "integrity:always_equal" in result.flags
    honest = (
        "class Money:\n"
        "    def __init__(self, n): self.n = n\n"
        "    def __eq__(self, other): return self.n == other\n"
        "    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Money(a + b)\n"
    )
    _, result = grade({"solution.py": honest}, isolation="in_process")
    assert (result.status, result.reward, result.flags) == (Status.SUCCEEDED, 1.0, [])


def test_a_test_module_the_solution_skips_at_collection_is_a_violation(grade: Grade) -> None:
    # Was a break: with expected_tests unset, a module skipped at collection left the
    # denominator, so skipping the tests one fails raised the pass fraction to 1.0.
    hidden = {
        "tests/test_add.py": "from solution import add\ndef test_add():\n    assert add(1, 2) == 3",
        "tests/test_mul.py": "from solution import mul\ndef test_mul():\n    assert mul(2, 3) == 6",
    }
    grading = {"command": ["python", "-m", "pytest", "-q", "tests"], "isolation": "in_process"}
    skips = (
        "def add(a, b):\n    return a + b\n"
        "def __getattr__(name):\n"
        "    import pytest\n"
        "    pytest.skip('not today', allow_module_level=True)\n"
    )
    _, result = grade({"solution.py": skips}, hidden_tests=hidden, grading=grading)
    assert (result.status, result.reward) == (Status.INTEGRITY_VIOLATION, 0.0), result.feedback
    assert "integrity:framework_tampered" in result.flags
    # A task's own module-level skip is no violation, but its tests count as one failure.
    hidden["tests/test_mul.py"] = "import pytest\npytest.skip('later', allow_module_level=True)\n"
    honest = {"solution.py": "def add(a, b):\n    return a + b\n"}
    _, result = grade(honest, hidden_tests=hidden, grading=grading)
    assert (result.status, result.reward) == (Status.SUCCEEDED, 0.5), result.feedback
