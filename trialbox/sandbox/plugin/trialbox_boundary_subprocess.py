"""The boundary's subprocess shim: a test's `subprocess.run` runs the program in the policy's
process, as the policy's uid, in its workspace (trialbox_boundary; standard library only).

trialbox_boundary puts `run` and `call` in place of subprocess's own (check_output and
check_call go through them; Popen is not forwarded and runs in the grader's tree, which holds
no code of the agent's). A command that names one of the task's hidden files (a checker
script, listed in HIDDEN) is the task's own and runs here, with the real subprocess.run, so a
planted copy in the workspace is never the one that runs. Only plain values cross, both ways.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any

import trialbox_wire as wire
from trialbox_boundary_client import PolicyDied, policy


def _text(data: bytes | None, text: bool, encoding: str | None, errors: str | None) -> Any:
    if data is None or not text:
        return data
    stream = io.TextIOWrapper(io.BytesIO(data), encoding or "utf-8", errors, newline=None)
    return stream.read()


_REAL_RUN = subprocess.run
HIDDEN: set[str] = set()  # the hidden files' paths in the grading tree


def _names_hidden_file(args: Any, cwd: Any) -> bool:
    """A command that names one of the task's hidden files (a checker script) is the task's
    own: it runs here, never in the policy's workspace, where the agent could plant its own."""
    words = args.split() if isinstance(args, str) else [os.fsdecode(a) for a in args]
    base = os.fsdecode(cwd) if cwd is not None else os.getcwd()
    return any(os.path.normpath(os.path.join(base, w)) in HIDDEN for w in words)


def run(args: Any, **options: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, in the policy's process (check_output, call and friends use it), unless
    the command names a hidden file of the task."""
    if _names_hidden_file(args, options.get("cwd")):
        return _REAL_RUN(args, **options)
    text: bool = bool(options.pop("text", None) or options.pop("universal_newlines", None))
    encoding, errors = options.pop("encoding", None), options.pop("errors", None)
    text = text or encoding is not None or errors is not None
    data = options.pop("input", None)
    if isinstance(data, str):
        data = data.encode(encoding or "utf-8", errors or "strict")
    stdin = options.pop("stdin", None)
    if stdin not in (None, subprocess.DEVNULL, subprocess.PIPE):
        data = stdin.read() if hasattr(stdin, "read") else data
        data = data.encode() if isinstance(data, str) else data
    if options.pop("capture_output", False):
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
    stdout, stderr = options.pop("stdout", None), options.pop("stderr", None)
    timeout, check = options.pop("timeout", None), options.pop("check", False)
    shell, env = options.pop("shell", False), options.pop("env", None)
    for ignored in ("cwd", "close_fds", "bufsize", "executable", "start_new_session"):
        options.pop(ignored, None)
    if options:
        raise TypeError(f"subprocess options the boundary cannot honour: {sorted(options)}")
    argv = args if isinstance(args, str) else [os.fsdecode(a) for a in args]
    request = {
        "op": "run",
        "options": {
            "args": argv,
            "input": wire.encode(data, None) if data is not None else None,
            "capture": [stdout is not None, "stdout" if stderr == subprocess.STDOUT else True],
            "timeout": timeout,
            "shell": bool(shell),
            "env": dict(env) if env is not None else None,
        },
    }
    p = policy()
    done = p.ask(request)
    if not isinstance(done, dict):
        raise PolicyDied("the solution's process answered a subprocess with nothing")
    out = wire.decode(done.get("stdout"), None)
    err = wire.decode(done.get("stderr"), None)
    if done.get("timeout"):
        raise subprocess.TimeoutExpired(argv, timeout or 0, out, err)
    results = []
    for data_out, target in ((out, stdout), (err, stderr)):
        if target == subprocess.PIPE:
            results.append(_text(data_out, text, encoding, errors))
        else:
            if target is None and data_out:
                sys.stdout.write(bytes(data_out).decode(errors="replace"))
            results.append(None)
    completed = subprocess.CompletedProcess(argv, int(done["returncode"]), *results)
    if check:
        completed.check_returncode()
    return completed


def call(*args: Any, **options: Any) -> int:
    return run(*args, **options).returncode
