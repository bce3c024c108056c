"""The twin's Lambda: each function's real `functions/<name>/handler.py`, in processes of its
own with the function's own environment (handlers read it at import, as in Lambda)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import struct
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import IO

from trialbox.local.resources import ACCOUNT, REGION, FunctionSpec

ROOT = Path(__file__).resolve().parents[2]  # a checkout's root, where functions/ lives


class Context:
    """What Powertools reads from a Lambda context."""

    def __init__(self, name: str, timeout_s: float = 300) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)


def _frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _unframe(stream: IO[bytes]) -> bytes | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return stream.read(size)


def serve(name: str, handler_path: str, log_path: str) -> None:
    """`python -m trialbox.local.functions NAME HANDLER LOG`: one function's process. The
    environment is the function's own; stdin/stdout carry length-prefixed invocations."""
    requests_in, answers = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log  # Powertools' EMF metrics and JSON logs go here
    module, attr = handler_path.rsplit(".", 1)
    handler = getattr(importlib.import_module(module), attr)
    while (payload := _unframe(requests_in)) is not None:
        try:
            out = handler(json.loads(payload or b"null"), Context(name))
            _frame(answers, b"1" + json.dumps(out).encode())
        except Exception as exc:  # an unhandled function error, as Lambda reports it
            error = {
                "errorType": type(exc).__name__,
                "errorMessage": str(exc),
                "stackTrace": traceback.format_exception(exc)[-5:],
            }
            _frame(answers, b"0" + json.dumps(error).encode())


class FunctionHost:
    def __init__(
        self, specs: dict[str, FunctionSpec], env: dict[str, str], log_dir: Path, copies: int = 2
    ) -> None:
        self.specs = {
            name: FunctionSpec(spec.name, spec.handler, spec.environment | env)
            for name, spec in specs.items()
        }
        self.log_dir = log_dir
        self.copies = copies
        self.idle: dict[str, queue.Queue[subprocess.Popen[bytes]]] = {}

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join([str(ROOT), *sys.path])
        for name, spec in self.specs.items():
            self.idle[name] = queue.Queue()
            log = str(self.log_dir / f"{name}.log")
            for _ in range(self.copies):
                process = subprocess.Popen(
                    [sys.executable, "-m", "trialbox.local.functions", name, spec.handler, log],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=spec.environment | {"PYTHONPATH": path},
                )
                self.idle[name].put(process)

    def invoke(self, name: str, payload: bytes) -> tuple[bool, bytes]:
        pool = self.idle[name]
        process = pool.get()
        try:
            assert process.stdin is not None and process.stdout is not None
            _frame(process.stdin, payload)
            answer = _unframe(process.stdout)
            if answer is None:
                error = {"errorType": "Runtime.ExitError", "errorMessage": f"{name} exited"}
                return False, json.dumps(error).encode()
            return answer[:1] == b"1", answer[1:]
        finally:
            pool.put(process)

    def stop(self) -> None:
        for pool in self.idle.values():
            while not pool.empty():
                process = pool.get()
                with contextlib.suppress(OSError):
                    assert process.stdin is not None
                    process.stdin.close()
                try:
                    process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    serve(*sys.argv[1:4])
