"""The worker's helpers (trialbox.sandbox.checkpoint_child's) as forks of one small process
that has their code imported, instead of a new interpreter each: a new interpreter cost the
worker about 70 ms of CPU per helper, and a sample had one or two.

multiprocessing's fork server would do this, but on Python 3.11 each of its children runs the
caller's __main__ script again (its server never preloads a script): under the `trialbox` CLI
that is the CLI's imports, about a second, per helper.

The zygote is `python -S -m trialbox.sandbox.zygote FD`, single-threaded, serving requests on
the control socket FD until it closes (the worker is gone). A request is one JSON message,
`[args, cpu_budget_s, accounting]`, with two descriptors: the data socket and the report
socket. For each request the zygote forks a waiter, which forks the helper and waits for it:

- the helper joins the slot's accounting (it writes itself into each procs file: on bwrap the
  slot's cgroup), takes a session of its own, its CPU budget (RLIMIT_CPU) and no core, then
  runs checkpoint_child's work on the data socket, its reason on the report socket;
- the waiter writes the helper's exit code (-N for signal N) and CPU (wait4's rusage) as the
  report's last line, `STATUS code cpu_s`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, cast

STATUS = "\n\x00status "  # before the report's last line
JOIN_FAILED = 125  # the helper could not join the slot's accounting
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class Zygote:
    """The worker's handle: started on first use, started again when it is gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def run(
        self, args: list[str], cpu_budget_s: int, accounting: tuple[Path, ...], stdin: bytes | None
    ) -> tuple[int, bytes, str, float]:
        """A helper's (exit code, what it wrote on its data socket when nothing goes in, its
        reason, its CPU seconds). A zygote that died before it took the request (killed, say)
        is replaced, and the request sent again."""
        request = json.dumps([args, cpu_budget_s, [str(p) for p in accounting]]).encode()
        for _ in range(2):
            answer = self._once(request, stdin)
            if answer is not None:
                return answer
        raise OSError("the worker's zygote died twice before it took a helper's request")

    def _once(self, request: bytes, stdin: bytes | None) -> tuple[int, bytes, str, float] | None:
        data, their_data = socket.socketpair()
        report, their_report = socket.socketpair()
        with data, report:
            with their_data, their_report:
                zygote = self._send(request, [their_data.fileno(), their_report.fileno()])
            out = b""
            if stdin is None:
                out = _read_all(data)
            else:
                try:
                    data.sendall(stdin)
                    data.shutdown(socket.SHUT_WR)
                except (BrokenPipeError, ConnectionResetError):  # its status says why
                    pass
            said = _read_all(report).decode(errors="replace")
        reason, marked, status = said.rpartition(STATUS)
        if marked:
            code, cpu_s = status.split()
            return int(code), out, reason.strip(), float(cpu_s)
        if not said and not out and _died(zygote):
            return None  # the request went down with it: no waiter was forked
        raise OSError(f"the helper's waiter ended without its status: {said[-2000:]}")

    def _send(self, request: bytes, fds: list[int]) -> subprocess.Popen[bytes]:
        """The zygote that took the request: this one, or a new one if it is gone."""
        with self._lock:
            if self._control is None or self._process is None or self._process.poll() is not None:
                self._start()
            try:
                return self._sent(request, fds)
            except OSError:  # it died: a new one takes the request
                self._start()
                return self._sent(request, fds)

    def _sent(self, request: bytes, fds: list[int]) -> subprocess.Popen[bytes]:
        assert self._control is not None and self._process is not None
        socket.send_fds(self._control, [request], fds)
        return self._process

    def _start(self) -> None:
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-S", "-P", "-m", __name__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": PACKAGE_ROOT},
                cwd="/",
                start_new_session=True,
            )
        self._control = ours

    def _stop(self) -> None:
        control, process = self._control, self._process
        self._control = self._process = None
        if control is not None:
            control.close()  # the zygote sees its control socket close, and exits
        if process is not None:
            process.wait()


def _died(zygote: subprocess.Popen[bytes]) -> bool:
    """Whether the zygote is gone (its sockets closed as it exited: it is reaped at once)."""
    try:
        zygote.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def serve(control: socket.socket) -> None:
    """The zygote's loop: a waiter forked per request; the kernel reaps the waiters."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        if not message:
            return
        if os.fork() == 0:
            control.close()
            try:
                _wait(json.loads(message), fds)
            finally:
                os._exit(1)  # the waiter's own status is read by nobody (SIGCHLD is ignored)
        for fd in fds:
            os.close(fd)


def _wait(request: list[object], fds: list[int]) -> None:
    """The waiter: the helper forked, waited for, and its status written."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own child is waited for, not reaped
    data_fd, report_fd = fds
    pid = os.fork()
    if pid == 0:
        code = 1  # whatever escapes the helper (a reason it could not write, say) is a failure
        try:
            code = _helper(request, data_fd, report_fd)
        finally:
            os._exit(code)
    os.close(data_fd)
    _, status, usage = os.wait4(pid, 0)
    with os.fdopen(report_fd, "w") as report:
        code = os.waitstatus_to_exitcode(status)
        report.write(f"{STATUS}{code} {usage.ru_utime + usage.ru_stime}\n")


def _helper(request: list[object], data_fd: int, report_fd: int) -> int:
    from trialbox.sandbox.checkpoint_child import work  # imported by the zygote already

    args, cpu_budget_s, accounting = request
    assert isinstance(args, list) and isinstance(cpu_budget_s, int)
    assert isinstance(accounting, list)
    # A reason may name a path that is not UTF-8 (a policy's file name): written escaped.
    with os.fdopen(report_fd, "w", buffering=1, errors="backslashreplace") as said:
        try:
            for procs in accounting:
                Path(procs).write_text("0")
        except OSError as exc:
            print(f"joining the slot's accounting: {exc}", file=said)
            return JOIN_FAILED
        try:
            os.setsid()
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_budget_s, cpu_budget_s))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            with socket.socket(fileno=data_fd) as data, data.makefile("rwb") as stream:
                return work([str(a) for a in args], cast(IO[bytes], stream), said)
        except BaseException:
            traceback.print_exc(file=said)
            return 1


def main(argv: list[str]) -> None:
    import trialbox.sandbox.checkpoint_child  # noqa: F401  (every helper's code, once)

    serve(socket.socket(fileno=int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
