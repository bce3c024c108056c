"""Hostile programs against the bwrap backend: each asserts the exact outcome."""

from __future__ import annotations

import os
import resource
import socket
import uuid
from pathlib import Path

import pytest

from tests.support.programs import FORK_BOMB, SETSID_DAEMON
from tests.support.sandbox import Exec, secret_in_another_slot
from trialbox.models import Limits, Status
from trialbox.sandbox.processes import processes_of
from trialbox.sandbox.runner import Runner


def all_slot_uids(runner: Runner) -> tuple[int, ...]:
    config = runner.config
    return tuple(range(config.uid_base, config.uid_base + 2 * config.slots))


def test_memory_bomb_is_oom_with_peak_near_limit(run_exec: Exec) -> None:
    result = run_exec(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))", memory_mb=128
    )
    assert result.status == Status.OOM
    assert result.oom_killed is True and result.timed_out is False
    assert result.signal == "SIGKILL" and result.exit_code is None
    assert 100 <= result.peak_memory_mb <= 130


def test_infinite_loop_times_out_within_two_seconds_of_the_limit(run_exec: Exec) -> None:
    # 2 s: on a machine the suite's other workers share, the loop still gets 0.5 s of CPU.
    result = run_exec("while True:\n    pass", timeout_s=2)
    assert result.status == Status.TIMEOUT
    assert result.timed_out is True and result.signal == "SIGKILL" and result.exit_code is None
    assert 2.0 <= result.wall_s < 4.0
    assert result.cpu_s > 0.5


def test_fork_bomb_is_contained_and_nothing_survives(run_exec: Exec, runner: Runner) -> None:
    code = FORK_BOMB
    result = run_exec(code, pids=32, timeout_s=5)
    forked, errno = map(int, result.stdout.split())
    assert errno == 11  # EAGAIN: pids.max reached
    assert forked < 32
    assert result.status == Status.SUCCEEDED and result.wall_s < 5
    assert processes_of(all_slot_uids(runner)) == []


def test_double_forked_daemon_ignoring_sigterm_is_gone(run_exec: Exec, runner: Runner) -> None:
    code = SETSID_DAEMON
    result = run_exec(code)
    assert result.stdout == "parent done\n"
    assert result.wall_s < 5
    assert processes_of(all_slot_uids(runner)) == []


def test_a_gibibyte_of_output_keeps_head_and_tail_and_little_memory(run_exec: Exec) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = (
        "import sys\n"
        "sys.stdout.write('HEAD\\n'); sys.stdout.flush()\n"
        "chunk = b'x' * (1 << 20)\n"
        "for _ in range(1024):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "sys.stdout.buffer.write(b'\\nTHE-END\\n')\n"
    )
    result = run_exec(code, timeout_s=60)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.status == Status.SUCCEEDED and result.exit_code == 0
    assert result.stdout_truncated is True
    assert result.stdout.startswith("HEAD\n") and result.stdout.endswith("\nTHE-END\n")
    assert "bytes omitted ...]" in result.stdout
    assert len(result.stdout) < 70_000
    assert grown_kib < 50 * 1024


def test_disk_fill_gives_enospc_inside(run_exec: Exec) -> None:
    code = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        "    with open('fill', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'x' * 65536); f.flush(); written += 65536\n"
        "except OSError as e:\n"
        "    print(e.errno, written)\n"
    )
    result = run_exec(code, disk_mb=16, memory_mb=256)
    errno, written = map(int, result.stdout.split())
    assert errno == 28  # ENOSPC
    assert 15 * 2**20 <= written <= 16 * 2**20


def test_loopback_and_dns_are_unreachable(run_exec: Exec) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', type(e).__name__)\n"
            "try:\n"
            "    socket.getaddrinfo('pypi.org', 443)\n"
            "    print('resolved')\n"
            "except OSError as e:\n"
            "    print('dns-failed', type(e).__name__)\n"
        )
        result = run_exec(code)
    finally:
        server.close()
    # The seccomp filter refuses an AF_INET socket outright (EAFNOSUPPORT): nothing to refuse.
    assert result.stdout == "refused OSError\ndns-failed gaierror\n"


def test_host_secrets_and_other_workspaces_are_unreadable(runner: Runner) -> None:
    with secret_in_another_slot(runner) as path:
        code = (
            f"for p in ['/root/.bashrc', '/etc/shadow', {str(path)!r}]:\n"
            "    try:\n"
            "        open(p).read(); print('read', p)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
        )
        result = runner.exec(["python", "-c", code], Limits())
    assert result.stdout == "FileNotFoundError\nFileNotFoundError\nFileNotFoundError\n"


WRITE_EVERYWHERE = """
import errno, os
found = []
for place in ("/", "/opt", "/usr", "/etc", "/var", "/dev"):
    try:
        with open(os.path.join(place, "trialbox-probe"), "wb") as f:
            f.write(b"x")
        found.append(place)
    except OSError:
        pass
for place in ("/dev/shm", "/tmp"):
    try:
        with open(os.path.join(place, "fill"), "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
        found.append(place + " uncapped")
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
print("writable:", found)
"""


def test_every_writable_place_is_capped_and_the_rest_read_only(run_exec: Exec) -> None:
    result = run_exec(WRITE_EVERYWHERE, disk_mb=8, memory_mb=256)
    assert result.stdout.strip() == "writable: []", result.stderr


def test_tmp_is_private(run_exec: Exec) -> None:
    name = f"/tmp/trialbox-probe-{uuid.uuid4()}"
    result = run_exec(f"open({name!r}, 'w').write('x'); print(open({name!r}).read())")
    assert result.stdout == "x\n"
    assert not os.path.exists(name)


def test_host_processes_and_aws_variables_are_invisible(
    run_exec: Exec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "must-not-leak")
    code = (
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(pids)\n"
        "print(sorted(k for k in os.environ if k.startswith('AWS')))\n"
        f"print(os.path.exists('/proc/{os.getpid()}/cmdline'))\n"
    )
    result = run_exec(code)
    lines = result.stdout.splitlines()
    assert lines[0] in ("[1, 2]", "[1, 2, 3]")  # bwrap's init, the command (and its pid 1)
    assert lines[1:] == ["[]", "False"]


def test_sandboxed_code_runs_unprivileged(run_exec: Exec, runner: Runner) -> None:
    code = (
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "print(os.getuid(), status.split('CapEff:')[1].split()[0], 'NoNewPrivs:\\t1' in status)\n"
        "try:\n"
        "    open('/usr/pwned', 'w')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    uid, caps, no_new_privs, write_error = run_exec(code).stdout.split()
    assert runner.config.uid_base <= int(uid) < runner.config.uid_base + 2 * runner.config.slots
    assert caps == "0000000000000000" and no_new_privs == "True"
    assert write_error in ("OSError", "PermissionError")


def test_exit_codes_are_reported_as_observed(run_exec: Exec) -> None:
    assert run_exec("raise SystemExit(3)").exit_code == 3
    killed = run_exec("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.exit_code == 137 and killed.signal is None
    assert killed.status == Status.SUCCEEDED


def test_files_dir_is_copied_into_the_workspace(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "data.txt").write_text("hello")
    (tmp_path / "link").symlink_to("/etc/hostname")
    result = runner.exec(
        ["sh", "-c", "cat pkg/data.txt; echo; ls -a"], Limits(), files_dir=tmp_path
    )
    assert result.stdout.split() == ["hello", ".", "..", "pkg"]


def test_a_deadline_shorter_than_the_sandboxs_start_is_the_commands_timeout(
    runner: Runner,
) -> None:
    """Killed at its deadline before the command started, it timed out; never a sandbox
    failure, whose loss mask a policy could ask for with a tiny timeout (the red team's
    timeout_s=0.001 gave sandbox_error about 1 time in 30). On a loaded machine the runner
    may first look after `true` has already exited: that run ended, and succeeded."""
    outcomes = []
    for _ in range(40):
        result = runner.exec(["true"], Limits(timeout_s=0.001))
        outcomes.append((result.status, result.timed_out, result.exit_code))
    assert set(outcomes) <= {(Status.TIMEOUT, True, None), (Status.SUCCEEDED, False, 0)}
    assert (Status.TIMEOUT, True, None) in outcomes
