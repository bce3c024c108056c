"""Ctrl-C reaches every test and the commands it starts, however the suite was started: a
shell's background job (`make test &` in a script, a CI runner's) inherits SIGINT ignored, and
then the tests of Ctrl-C (`local up`, `trialbox run`, the SDK's gather) hang instead."""

from __future__ import annotations

import signal
import subprocess
import sys

SEES = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def test_sigint_raises_in_tests_and_in_the_commands_they_start() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    child = subprocess.run([sys.executable, "-c", SEES], capture_output=True, text=True)
    assert child.stdout == "True\n", child.stderr
