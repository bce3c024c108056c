"""The grader's side of the isolation boundary (imported by trialbox_report; standard library
only).

The policy's modules are never imported here. An import of one of the names the runner lists
(the workspace's top-level modules that shadow nothing of the runtime's or the hidden tests')
is answered by the policy's process (trialbox_policy): plain values arrive as exact
built-in values, everything else as a remote handle whose attribute access, calls and operators
go over the wire again, with the grading time left as their deadline. A test's
`subprocess.run` runs the program in the policy's process, as the policy's uid.

Equality with a handle is asked with the real value and DECOYS decoys shaped like it
(trialbox_decoy), in random order: an object equal to the real value and a decoy is flagged
`always_equal` and compares unequal; one that picks a single question to say yes to is right
once in DECOYS + 1. Without a decoy (an array, a value that cannot cross), `==` and `!=` fall
back to Python's own: unequal.

When the policy's process dies (os._exit, a signal, a deadline), the call waiting on it raises
PolicyDied, which no `except Exception` or `pytest.raises(Exception)` catches; the next test
gets a fresh process from the zygote (at most MAX_SPAWNS), so one crash costs only the tests
it was in. Handles from a dead process are gone; module attributes are looked up again by name.

This module sets the boundary up from its parts: the wire client (trialbox_boundary_client),
the remote handles (trialbox_boundary_handles), the import hook (trialbox_boundary_imports)
and the subprocess shim (trialbox_boundary_subprocess). Each is imported here before the hook
goes first on sys.meta_path, so none of them is ever a name the policy's process answers. What
trialbox_report and trialbox_guard read (FLAGS, TIMED_OUT), and PolicyDied, the name a failed
test shows, are re-exported here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trialbox_boundary_client as client
import trialbox_boundary_imports as imports
import trialbox_boundary_subprocess as shim
from trialbox_boundary_client import TIMED_OUT, PolicyDied, PolicyTimeout
from trialbox_boundary_handles import FLAGS, RemotePolicy

__all__ = ["FLAGS", "TIMED_OUT", "PolicyDied", "PolicyTimeout"]


def _install() -> None:
    fd = os.environ.pop("TRIALBOX_POLICY_FD", None)
    if fd is None:
        return
    spec_fd = int(os.environ.pop("TRIALBOX_POLICY_SPEC_FD"))
    with os.fdopen(spec_fd, "rb") as channel:
        spec = json.loads(channel.read())
    root = Path(os.environ.get("TRIALBOX_GRADING_ROOT", "."))  # trialbox_report pops it
    shim.HIDDEN.update(os.path.normpath(root / path) for path in spec["hidden"])
    client.connect(RemotePolicy(int(fd), float(spec["budget_s"])))
    # First: a module of the policy's is never a local namespace package (the empty directory
    # its files left in the grading tree). The names shadow nothing of the runtime's or tests'.
    sys.meta_path.insert(
        0, imports.PolicyModules(frozenset(spec["modules"]), imports.read_tests(root))
    )
    subprocess.run = shim.run
    subprocess.call = shim.call


_install()
