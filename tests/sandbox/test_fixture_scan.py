"""The trusted plugin's fixture scan (trialbox_fixture_scan): pytest's own findings, at a
fraction of its work, in the sandbox runtime's pytest."""

from __future__ import annotations

import subprocess
from pathlib import Path

from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.runtime import Runtime

# Every way pytest 9 warns of a fixture it cannot discover, and attributes that hide none.
TESTS = """
import functools
import pytest


def plain(x):
    return x


class TestHolder:
    @staticmethod
    @pytest.fixture
    def static_above():
        return 1

    @classmethod
    @pytest.fixture
    def class_above(cls):
        return 2

    def test_holder(self):
        assert plain(1) == 1


@pytest.fixture
def base():
    return 3


@functools.wraps(base)
def wrapped(*args, **kwargs):
    return base(*args, **kwargs)


def test_one():
    assert plain(2) == 2
"""
# Counts the original check's unwraps (each plugin attribute it looks behind), then prints the
# warnings pytest gave, sorted: the two runs must print the same.
COUNTER = """
import pytest
from _pytest import fixtures

_find = fixtures.FixtureManager._find_wrapped_fixture_def
UNWRAPS = [0]


def _counted(self, obj):
    UNWRAPS[0] += 1
    return _find(self, obj)


fixtures.FixtureManager._find_wrapped_fixture_def = _counted
SEEN = []


def pytest_warning_recorded(warning_message, when, nodeid, location):
    SEEN.append(str(warning_message.message))


def pytest_unconfigure(config):
    print("UNWRAPS", UNWRAPS[0])
    for message in sorted(SEEN):
        print("WARNING", message)
"""
SCANNED = "import trialbox_fixture_scan\ntrialbox_fixture_scan.install()\n"


def run(tmp_path: Path, runtime: Runtime, plugins: list[str]) -> tuple[int, list[str]]:
    argv = [str(runtime.python), "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for plugin in plugins:
        argv += ["-p", plugin]
    done = subprocess.run(
        [*argv, "-c", "/dev/null", f"--rootdir={tmp_path}", str(tmp_path / "tests")],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": f"{tmp_path / 'plugins'}:{runtime.plugin_dir}",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
    )
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    unwraps = next(int(line.split()[1]) for line in lines if line.startswith("UNWRAPS"))
    return unwraps, [line for line in lines if line.startswith("WARNING")]


def test_the_scan_gives_pytest_s_own_warnings_and_unwraps_only_what_can_hide_a_fixture(
    tmp_path: Path,
) -> None:
    runtime = Runtime.load(SandboxConfig.from_env().runtime_dir)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_hidden.py").write_text(TESTS)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "counter.py").write_text(COUNTER)
    (tmp_path / "plugins" / "scanned.py").write_text(SCANNED)
    unwraps, warned = run(tmp_path, runtime, ["counter"])
    scanned_unwraps, scanned_warned = run(tmp_path, runtime, ["counter", "scanned"])
    assert scanned_warned == warned
    assert any("@staticmethod above @pytest.fixture" in w for w in warned), warned
    assert any("wrapped by @classmethod" in w for w in warned), warned
    assert any("'wrapped' due to being wrapped in decorators" in w for w in warned), warned
    # pytest looks behind every attribute of every plugin (over a thousand); the scan behind
    # the few that have a __wrapped__ chain or are static or class methods.
    assert unwraps > 500
    assert scanned_unwraps < 60, scanned_unwraps
