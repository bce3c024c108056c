"""Run a command against `trialbox local up`: start the twin in this venv, hand its exports
(TRIALBOX_*, SANDBOX_FUSION_ENDPOINT) to the command in its environment, stop the twin after.
`make integration-smoke` runs verl's part so, in verl's own venv, as a verl worker would
reach a deployment (verl's omegaconf pins an antlr4 that moto's Step Functions cannot use)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def main(command: list[str]) -> int:
    twin = subprocess.Popen(
        [str(BIN / "trialbox"), "local", "up"], stdout=subprocess.PIPE, text=True
    )
    assert twin.stdout is not None
    exports = {}
    try:
        for line in twin.stdout:
            if line.startswith("export "):
                name, value = line.removeprefix("export ").strip().split("=", 1)
                exports[name] = value
            if line.startswith("# serving"):
                break
        else:
            print("the twin did not start", file=sys.stderr)
            return 1
        return subprocess.run(command, env=os.environ | exports).returncode
    finally:
        twin.send_signal(signal.SIGINT)
        try:
            twin.wait(timeout=60)
        except subprocess.TimeoutExpired:
            twin.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
