"""No sandboxed process ever reads a credential: scanners left behind by the agent command and
by the graded code read every /proc/*/environ and cmdline they can while the worker cleans up
after them; the host samples every slot-uid process meanwhile."""

from __future__ import annotations

import json
import shlex

from tests.fargate.harness import Harness, Service
from tests.fargate.programs import SCAN_AFTER_EXIT, SOLUTION_WITH_SCANNER
from tests.fargate.submit import describe, python, request, run_jobs
from trialbox.models import Status
from trialbox.sdk import Client

ROUNDS = 3  # the cleanup after a command is short: give the race a few tries


def test_no_scanner_finds_a_credential(client: Client, service: Service, harness: Harness) -> None:
    requests = [request(commands=[python(SCAN_AFTER_EXIT)]) for _ in range(ROUNDS)]
    requests += [request(files={"solution.py": SOLUTION_WITH_SCANNER}, grade=True)]
    with harness.sampling() as sampled:
        results = run_jobs(client, service, requests)
    for result in results:
        assert result.status == Status.SUCCEEDED, describe(result)
    for result in results[:ROUNDS]:
        assert result.commands[0].stdout.startswith("scanner running\n")
    assert results[-1].reward == 1.0, describe(results[-1])
    seen = "\n".join(
        json.dumps(r.model_dump(mode="json"))
        + (client.read_object(r.trace_uri).decode(errors="replace") if r.trace_uri else "")
        for r in results
    )
    outputs = "".join(c.stdout + c.stderr for r in results for c in r.commands)
    assert "LEAK pid" not in outputs, outputs[:4000]
    assert harness.canaries.in_text(seen) == [], seen[:4000]
    assert sampled["samples"] > 0 and sampled["found"] == {}, sampled


def test_the_scanner_finds_a_planted_credential(harness: Harness) -> None:
    """The scanner can fail: a process of its own uid holding the variable is found."""
    uid = harness.uid_base
    planted = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=/v2/credentials/planted"
    script = f"env -i {planted} sleep 3 & exec python3 -c {shlex.quote(SCAN_AFTER_EXIT)}"
    inner = f"setpriv --reuid={uid} --regid={uid} --clear-groups sh -c {shlex.quote(script)}"
    done = harness.run_in_container(["/bin/sh", "-c", f"{inner}; sleep 1"], timeout=30)
    assert f"environ: {planted}" in done.stdout, done.stdout + done.stderr
