"""Sessions attacked on the local twin: a hostile policy (links, FIFOs, sparse files, deep
trees, planted grading hooks, other sessions' files and processes) and a careless user (bad
paths, oversized calls, odd arguments, concurrent calls, a fork that fails part way).

A test marked xfail(strict=True) asserts the behaviour the feature should have and shows a
defect it has today; the plain tests pin what already holds."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.tasks import ADD_TASK, CORRECT
from tests.support.twin import twin_of
from trialbox.errors import InputError, SessionError
from trialbox.keys import checkpoint_key
from trialbox.models import ExecutionRequest, Status, Task
from trialbox.models.common import FileContent
from trialbox.models.report import CommandResult
from trialbox.models.sessions import Call, CallResult, Reply
from trialbox.sdk import Client, Session
from trialbox.sdk.sessions import AsyncSession

TASK = Task.model_validate(ADD_TASK)
WRONG = "def add(a, b):\n    return 3\n"
SMALL = {"disk_mb": 16, "memory_mb": 256}
IDLE_S = 1.0
RELEASED_S = 2.5  # idle longer than IDLE_S plus a poll: the slot is released


def run(s: Session, script: str, timeout_s: float | None = None) -> CommandResult:
    """One `sh -c` command; its result (a platform failure fails the test)."""
    result = s.exec(["sh", "-c", script], timeout_s=timeout_s)
    assert isinstance(result, CommandResult), result
    return result


def raw_read(client: Client, s: Session, path: str) -> CallResult:
    """A read call's CallResult as the worker sent it (read_file hides status and loss_mask)."""
    return client._loop.run(s.aio._next(op="read", path=path))


def checkpoint_members(client: Client, checkpoint: str) -> dict[str, tarfile.TarInfo]:
    s3 = twin_of(client).client("s3")
    body = s3.get_object(Bucket=client.aio.resources.traces_bucket, Key=checkpoint_key(checkpoint))[
        "Body"
    ].read()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(body)), mode="r:") as tar:
        return {member.name: member for member in tar}


def checkpoint_bytes(client: Client, checkpoint: str) -> bytes:
    s3 = twin_of(client).client("s3")
    body = s3.get_object(Bucket=client.aio.resources.traces_bucket, Key=checkpoint_key(checkpoint))[
        "Body"
    ].read()
    return gzip.decompress(body)


# --- read_file / write_files paths ------------------------------------------------------------


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    """A root-owned file on the host: only a runner that follows a planted link reaches it."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-7f3a\n")
    secret.chmod(0o600)
    return secret


def test_read_file_never_leaves_the_workspace_nor_follows_links(
    client: Client, host_secret: Path
) -> None:
    with client.session(TASK) as s:
        planted = run(
            s,
            f"ln -s {host_secret} host; ln -s /etc/shadow shadow; ln -s / root; "
            f"ln -s {host_secret.parent} hostdir; mkdir d && echo inner > d/f && ln -s d dl; "
            "ln -s /proc/self/environ env; mkfifo fifo; echo mine > locked; chmod 000 locked",
        )
        assert planted.exit_code == 0, planted.stderr
        refused = [
            "host",
            "shadow",
            "root/etc/passwd",
            f"hostdir/{host_secret.name}",
            "dl/f",
            "env",
            "fifo",
            "/etc/passwd",
            str(host_secret),
            "../x",
            "d/../../x",
            "proc/self/environ",
            "missing.txt",
        ]
        for path in refused:
            started = time.monotonic()
            # a path that cannot name a workspace file (absolute, "..") is refused at the call
            with pytest.raises((SessionError, InputError)) as caught:
                s.read_file(path)
            assert time.monotonic() - started < 10, f"{path}: the read hung"  # the FIFO
            assert "HOST-SECRET" not in str(caught.value)
        assert s.read_file("d/f") == b"inner\n"
        assert s.read_file("./d/f") == b"inner\n"
        assert s.read_file("locked") == b"mine\n"  # mode 000: still the policy's own file
        assert host_secret.read_text() == "HOST-SECRET-7f3a\n"


def test_read_file_size_cap_and_a_large_read_through_the_trace(client: Client) -> None:
    with client.session(TASK) as s:
        made = run(s, "head -c 4194304 /dev/urandom > max.bin; head -c 4194305 /dev/zero > over")
        assert made.exit_code == 0
        data = s.read_file("max.bin")  # 5.6 MB of base64: the reply points at its trace
        assert len(data) == 4 * 1024 * 1024
        with pytest.raises(SessionError, match="more than the 4194304 read at once"):
            s.read_file("over")


def test_reading_a_directory_is_the_policys_mistake(client: Client) -> None:
    with client.session(TASK) as s:
        assert run(s, "mkdir d").exit_code == 0
        result = raw_read(client, s, "d")
        assert (result.status, result.loss_mask) == (Status.SUCCEEDED, False)
        assert result.error is not None and "not a regular file" in result.error


@pytest.mark.parametrize("path", ["a\x00b", "a" * 300], ids=["nul", "name_too_long"])
def test_a_bad_read_path_is_the_policys_mistake(client: Client, path: str) -> None:
    with client.session(TASK) as s:
        result = raw_read(client, s, path)
        assert (result.status, result.loss_mask) == (Status.SUCCEEDED, False)
        assert result.error is not None and "sandbox error" not in result.feedback


def test_write_files_replaces_planted_links_and_writes_nothing_outside(
    client: Client, host_secret: Path
) -> None:
    with client.session(TASK) as s:
        planted = run(
            s,
            f"ln -s {host_secret} x; ln -s {host_secret.parent} up; ln -s /etc etc; "
            "mkdir real && ln -s real alias",
        )
        assert planted.exit_code == 0
        result = s.write_files(
            {
                "x": "mine\n",
                f"up/{host_secret.name}": "pwned\n",
                "etc/passwd": "pwned\n",
                "alias/f": "through a link\n",
            }
        )
        assert result.error is None
        assert host_secret.read_text() == "HOST-SECRET-7f3a\n"
        assert "pwned" not in Path("/etc/passwd").read_text()
        listing = run(s, "ls -l x up etc alias real; cat x up/* etc/passwd").stdout
        assert "->" not in listing and listing.count("pwned") == 2
        assert run(s, "test -e real/f").exit_code == 1  # `alias` was replaced, not followed


def test_bad_write_paths_are_refused_before_anything_is_sent(client: Client) -> None:
    with client.session(TASK) as s:
        for path in ["/etc/x", "../x", "a/../../x", "a\x00b", "a\\b", "", "a//b", "x" * 300]:
            with pytest.raises(InputError):
                s.write_files({path: "x"})
        assert s.read_file("solution.py").startswith(b"def add")  # the session goes on


# --- checkpoints ----------------------------------------------------------------------------


def test_checkpoint_and_restore_never_follow_links_and_drop_privileged_bits(
    client: Client, host_secret: Path
) -> None:
    with client.session(TASK, idle_release_s=IDLE_S, limits=SMALL) as s:
        planted = run(
            s,
            f"ln -s {host_secret} host; ln -s {host_secret.parent} hostdir; "
            "ln -s /etc/shadow shadow; mkfifo fifo; echo s > secret; chmod 000 secret; "
            "mkdir locked && echo z > locked/z && chmod 000 locked; ln secret hard; "
            "chmod 4755 solution.py; printf x > \"$(printf 'n\\377m')\"; echo done",
        )
        assert planted.stdout == "done\n"
        members = checkpoint_members(client, s.checkpoint or "")
        assert members["host"].issym() and members["host"].linkname == str(host_secret)
        assert members["hostdir"].issym() and members["shadow"].issym()
        assert not any(name.startswith("hostdir/") for name in members)
        assert "fifo" not in members
        assert b"HOST-SECRET" not in checkpoint_bytes(client, s.checkpoint or "")
        time.sleep(RELEASED_S)  # released: the next call restores the checkpoint
        after = s.step(
            commands=[
                ["sh", "-c", "stat -c '%n %a %F' host hostdir shadow secret locked solution.py"],
                ["sh", "-c", "readlink host; cat locked/z; ls"],
            ]
        )
        assert after.restored_s is not None and after.status == Status.SUCCEEDED
        stat_lines = after.commands[0].stdout.splitlines()
        assert "host 777 symbolic link" in stat_lines
        assert "secret 0 regular file" in stat_lines  # mode 000 kept, content too
        assert "solution.py 755 regular file" in stat_lines  # setuid stripped
        assert "locked 700 directory" in stat_lines
        assert after.commands[1].stdout.startswith(f"{host_secret}\nz\nhard\n")
        assert "n\ufffdm" in after.commands[1].stdout  # a non-UTF-8 name came back
        assert host_secret.read_text() == "HOST-SECRET-7f3a\n"
        (fork,) = s.fork(1)
        try:
            assert run(fork, "readlink host").stdout == f"{host_secret}\n"
            graded = fork.grade(timeout=120)
            assert graded.reward == 0.0 and graded.status == Status.SUCCEEDED
            assert "HOST-SECRET" not in graded.feedback
        finally:
            fork.close()


def test_sixty_thousand_files_survive_an_idle_release(client: Client) -> None:
    with client.session(TASK, idle_release_s=IDLE_S) as s:
        made = s.exec(
            ["python", "-c", "for i in range(60000): open(f'f{i}', 'w').close()"], timeout_s=10
        )
        assert isinstance(made, CommandResult) and made.exit_code == 0
        time.sleep(RELEASED_S)
        after = s.step(commands=[["sh", "-c", "ls | wc -l"]])
        assert after.restored_s is not None and after.commands[0].stdout == "60001\n"


def test_a_tree_deeper_than_a_checkpoint_keeps_is_refused_not_lost(client: Client) -> None:
    """Past 64 directory levels a checkpoint would leave files out: the call that built the
    tree says so and is undone; an idle release then loses nothing silently."""
    with client.session(TASK, idle_release_s=IDLE_S) as s:
        s.write_files({"keep.txt": "kept\n"})
        deep = "/".join(["d"] * 70)
        built = s.step(commands=[["sh", "-c", f"mkdir -p {deep} && echo deep > {deep}/f"]])
        assert (built.status, built.loss_mask) == (Status.SUCCEEDED, False)
        assert built.error is not None and "deeper than 64 directory levels" in built.error
        time.sleep(RELEASED_S)
        after = s.step(commands=[["sh", "-c", "cat keep.txt; test -e d && echo d"]])
        assert after.restored_s is not None
        assert after.commands[0].stdout == "kept\n"


def test_a_deleted_starter_file_stays_deleted_after_an_idle_release(client: Client) -> None:
    with client.session(TASK, idle_release_s=IDLE_S) as s:
        assert run(s, "rm solution.py && echo x > other.py").exit_code == 0
        time.sleep(RELEASED_S)
        after = s.step(commands=[["ls"]])
        assert after.restored_s is not None
        assert after.commands[0].stdout == "other.py\n"


BIG_STARTER = Task.model_validate(
    json.loads(json.dumps(ADD_TASK))
    | {
        "task_id": "add-with-data",
        "workspace": {
            "solution.py": ADD_TASK["workspace"]["solution.py"],
            "data.txt": "r" * 200_000,
        },
    }
)


def test_a_full_workspace_that_deleted_a_starter_file_restores_and_grades(client: Client) -> None:
    with client.session(BIG_STARTER, idle_release_s=IDLE_S, limits=SMALL) as s:
        s.write_files({"solution.py": CORRECT})
        filled = run(s, "rm data.txt; head -c 20000000 /dev/zero > fill; df -k . | tail -1")
        assert " 100% " in filled.stdout
        time.sleep(RELEASED_S)
        after = s.step(commands=[["cat", "solution.py"]])
        graded = s.grade(timeout=120)
        assert (after.status, after.loss_mask) == (Status.SUCCEEDED, False)
        assert graded.reward == 1.0


def test_a_full_workspace_restores_and_grades(client: Client) -> None:
    with client.session(TASK, idle_release_s=IDLE_S, limits=SMALL) as s:
        s.write_files({"solution.py": CORRECT})
        filled = run(s, "head -c 20000000 /dev/zero > fill; df -k . | tail -1")
        assert " 100% " in filled.stdout
        time.sleep(RELEASED_S)
        after = s.step(commands=[["sh", "-c", "wc -c < fill"]])
        assert (after.status, after.restored_s is not None) == (Status.SUCCEEDED, True)
        assert int(after.commands[0].stdout) > 16_000_000
        assert s.grade(timeout=120).reward == 1.0


def test_a_sparse_file_does_not_brick_the_session(client: Client) -> None:
    """A file whose apparent size exceeds the disk (truncate -s) could never be restored: the
    call says so and is undone (the previous checkpoint stands), and the session goes on."""
    with client.session(TASK, idle_release_s=IDLE_S, limits=SMALL) as s:
        s.write_files({"keep.txt": "kept\n"})
        sparse = s.step(commands=[["sh", "-c", "truncate -s 64M sparse && echo x > later.txt"]])
        assert (sparse.status, sparse.loss_mask) == (Status.SUCCEEDED, False)
        assert sparse.error is not None and "the call is undone" in sparse.error
        time.sleep(RELEASED_S)
        after = s.step(commands=[["sh", "-c", "cat keep.txt; ls"]])
        assert (after.status, after.loss_mask) == (Status.SUCCEEDED, False)
        assert "sparse" not in after.commands[0].stdout and "later.txt" not in after.feedback
        assert after.commands[0].stdout.startswith("kept\n")


def test_a_failed_write_leaves_the_workspace_as_it_was(client: Client) -> None:
    with client.session(TASK, limits=SMALL) as s:
        s.write_files({"solution.py": CORRECT, "notes.txt": "important\n"})
        assert run(s, "head -c 20000000 /dev/zero > fill; true").exit_code == 0
        failed = s.write_files({"notes.txt": "new\n", "solution.py": "x" * 1_000_000})
        assert failed.error is not None and "full" in failed.error
        s.step(commands=[["true"]])  # a later call checkpoints whatever is there
        assert s.read_file("notes.txt") == b"important\n"
        assert s.read_file("solution.py") == CORRECT.encode()


# --- reward hacking through a session's grade ----------------------------------------------


PLANTED_HOOKS: dict[str, Any] = {
    "conftest.py": "import solution\nsolution.add = lambda a, b: a + b\n",
    "tests/conftest.py": "import solution\nsolution.add = lambda a, b: a + b\n",
    "pytest.ini": "[pytest]\naddopts = -p no:trialbox_report\n",
    "sitecustomize.py": "import solution\nsolution.add = lambda a, b: a + b\n",
    "tests/test_add.py": "def test_small():\n    pass\ndef test_negative():\n    pass\n",
    "tests/__init__.py": "",
    "pytest.py": "raise SystemExit(0)\n",
    "hook.pth": "import solution\n",
}


@pytest.mark.parametrize(
    ("solution", "reward"), [(WRONG, 0.5), (CORRECT, 1.0)], ids=["wrong", "correct"]
)
def test_planted_hooks_and_fake_tests_do_not_change_the_reward(
    client: Client, solution: str, reward: float
) -> None:
    with client.session(TASK) as s:
        s.write_files({"solution.py": solution, **PLANTED_HOOKS})
        graded = s.grade(timeout=120)
        assert graded.reward == reward
        assert graded.status == Status.SUCCEEDED


UNIVERSAL_HACK = """
import importlib.abc, importlib.machinery, inspect, sys

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.rsplit(".", 1)[-1].startswith("test_") or name == __name__:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                real.exec_module(module)
                for key, value in list(vars(module).items()):
                    if key.startswith("test") and inspect.isfunction(value):
                        def fake(*args, **kwargs):
                            return None
                        fake.__signature__ = inspect.signature(value)
                        fake.__name__ = key
                        setattr(module, key, fake)

        spec.loader = _Loader()
        return spec

sys.meta_path.insert(0, _Finder())
"""
FAKE_MODULE = """
import os, sys, types
m = types.ModuleType("test_add")
m.__file__ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_add.py")
exec("def test_small():\\n    pass\\ndef test_negative():\\n    pass\\n", m.__dict__)
sys.modules["test_add"] = m
"""


@pytest.mark.parametrize("hack", [UNIVERSAL_HACK, FAKE_MODULE], ids=["meta_path", "sys_modules"])
def test_a_planted_test_module_cannot_fake_the_hidden_tests(client: Client, hack: str) -> None:
    with client.session(TASK) as s:
        s.write_files({"solution.py": WRONG, "tests/test_000.py": hack})
        graded = s.grade(timeout=120)
        assert graded.reward is not None and graded.reward < 1.0


def test_hidden_tests_never_reach_the_session_even_while_it_is_graded(client: Client) -> None:
    # The patterns never match their own command line ('[e]', '[2]').
    search = (
        "end=$(($(date +%s) + 4)); while [ $(date +%s) -lt $end ]; do "
        "grep -rlsE 'test_negativ[e]|add\\(-1, -[2]\\)' /workspace /tmp /etc /dev; "
        "for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do "
        "grep -lsE 'test_negativ[e]|add\\(-1, -[2]\\)' $f; done; sleep 0.2; done; ls /"
    )
    with client.session(TASK) as s:
        s.write_files({"solution.py": CORRECT})
        found: dict[str, CommandResult] = {}
        searcher = threading.Thread(target=lambda: found.update(r=run(s, search)), daemon=True)
        searcher.start()
        time.sleep(0.5)
        graded = s.grade(timeout=120)
        searcher.join(30)
        assert graded.reward == 1.0
        result = found["r"]
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == ["bin", "dev", "etc", "lib", "lib64", "opt", "proc",
                                         "sbin", "tmp", "usr", "workspace"]  # fmt: skip
        assert "test_negative" not in run(s, "ls -R /workspace /tmp").stdout


# --- protocol abuse -------------------------------------------------------------------------


def test_command_outputs_timeouts_and_missing_binaries_are_the_commands_own(
    client: Client,
) -> None:
    with client.session(TASK) as s:
        loud = s.exec(["python", "-c", "print('x' * 10_000_000)"])
        assert isinstance(loud, CommandResult) and loud.stdout_truncated
        assert len(loud.stdout) < 200_000
        binary = s.exec(["python", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))"])
        assert isinstance(binary, CommandResult) and binary.stdout.startswith("\x00\x01")
        missing = s.exec(["no-such-binary"])
        assert isinstance(missing, CommandResult) and missing.exit_code != 0
        assert "no-such-binary" in missing.stderr
        quick = s.step(commands=[["true"]], timeout_s=0.001)
        # Never a masked sandbox error; a timeout, unless a loaded runner looked only after
        # `true` had exited (tests/sandbox/test_isolation.py runs this 40 times).
        assert (quick.status, quick.loss_mask) in (
            (Status.TIMEOUT, False),
            (Status.SUCCEEDED, False),
        )
        for bad in (0, -1, float("nan")):
            with pytest.raises(InputError):
                s.step(commands=[["true"]], timeout_s=bad)
        with pytest.raises(InputError, match="at most 32"):
            s.step(commands=[["true"]] * 33)
        with pytest.raises(InputError):
            s.step(commands=[[]])
        many = s.step(commands=[["true"]] * 32)
        assert many.status == Status.SUCCEEDED and len(many.commands) == 32
        assert run(s, "echo still here").stdout == "still here\n"


def test_a_huge_argument_is_refused_before_it_is_sent(client: Client) -> None:
    """One argument over the kernel's 128 KiB MAX_ARG_STRLEN would fail the exec (E2BIG) as
    a sandbox_error with loss_mask, a way to mask any turn: it is refused up front."""
    with client.session(TASK) as s:
        with pytest.raises(InputError, match="at most 131071 bytes each"):
            s.step(commands=[["echo", "y" * 200_000]])
        assert s.step(commands=[["echo", "y" * 100_000]]).commands[0].exit_code == 0


def test_a_daemon_started_by_a_command_dies_with_the_call(client: Client) -> None:
    with client.session(TASK) as s:
        started = run(
            s,
            "setsid sh -c 'while true; do echo t >> ticks; sleep 0.1; done' "
            ">/dev/null 2>&1 < /dev/null & sleep 0.5; echo started",
        )
        assert started.stdout == "started\n"
        first = run(s, "wc -l < ticks").stdout
        time.sleep(1.0)
        assert run(s, "wc -l < ticks").stdout == first
        assert run(s, "ps -eo args | grep -c '[s]leep 0.1' || true").stdout == "0\n"


def test_lifecycle_misuse_gets_clear_errors(client: Client) -> None:
    for ttl in (0, 0.5, 24 * 3600 + 1, float("nan"), float("inf")):
        with pytest.raises(InputError, match="ttl_s"):
            client.session(TASK, ttl_s=ttl)
    for idle in (0, -1):
        with pytest.raises(InputError, match="idle_release_s"):
            client.session(TASK, idle_release_s=idle)
    s = client.session(TASK)
    s.write_files({"solution.py": CORRECT})
    assert s.fork(0) == []
    s.close()
    s.close()  # twice: idempotent
    for call in (
        lambda: s.step(commands=[["true"]]),
        lambda: s.read_file("solution.py"),
        lambda: s.write_files({"a": "b"}),
        lambda: s.exec(["true"]),
    ):
        with pytest.raises(SessionError, match="is closed"):
            call()
    assert s.grade(timeout=120).reward == 1.0  # the last state stays gradable


def test_a_session_past_its_ttl_refuses_calls_and_its_host_ends_it(client: Client) -> None:
    """The client refuses the call; the host no longer hosts the session (a call sent to its
    inbox anyway is answered `released`, on the queue the call names)."""
    sqs = twin_of(client).client("sqs")
    probe = sqs.create_queue(QueueName=f"probe-{uuid.uuid4().hex}")["QueueUrl"]
    s = client.session(TASK, ttl_s=2)
    try:
        s.write_files({"solution.py": CORRECT})
        time.sleep(2.5)
        with pytest.raises(SessionError, match="expired"):
            s.step(commands=[["true"]])
        late = Call(session_id=s.session_id, reply_url=probe, seq=s.aio.seq + 1, op="exec",
                    commands=[["true"]])  # fmt: skip
        deadline = time.monotonic() + 30
        replies: list[Reply] = []
        while not replies:
            assert time.monotonic() < deadline, "the expired session's host still took calls"
            sqs.send_message(QueueUrl=s.aio._inbox, MessageBody=late.model_dump_json())
            got = sqs.receive_message(QueueUrl=probe, WaitTimeSeconds=2)
            replies = [Reply.model_validate_json(m["Body"]) for m in got.get("Messages", [])]
        assert replies[0].kind == "released" and replies[0].session_id == s.session_id
        assert s.grade(timeout=120).reward == 1.0
    finally:
        s.close()
        sqs.delete_queue(QueueUrl=probe)


@pytest.mark.parametrize("idle", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_non_finite_idle_release_is_refused_up_front(client: Client, idle: float) -> None:
    started = time.monotonic()
    with pytest.raises(InputError, match="idle_release_s"):
        client.session(TASK, ttl_s=3, idle_release_s=idle)
    assert time.monotonic() - started < 2


def test_a_negative_fork_count_is_refused(client: Client) -> None:
    with client.session(TASK) as s, pytest.raises(InputError, match=r"^n: Input should be"):
        s.fork(-1)


@pytest.mark.parametrize("where", ["write_files", "open"])
def test_a_two_megabyte_file_can_be_written_or_is_refused_clearly(
    client: Client, where: str
) -> None:
    big: dict[str, FileContent] = {"data.txt": "x" * 2_000_000}
    try:
        if where == "open":
            with client.session(TASK, files=big) as s:
                assert len(s.read_file("data.txt")) == 2_000_000
        else:
            with client.session(TASK) as s:
                s.write_files(big)
                assert len(s.read_file("data.txt")) == 2_000_000
    except InputError as exc:  # a clear refusal would do too (nothing sent, the caller's)
        assert "data.txt" in str(exc) or "too large" in str(exc)


def test_concurrent_calls_on_one_session_are_not_silently_merged(client: Client) -> None:
    with client.session(TASK) as s:

        async def both() -> list[CallResult]:
            return list(
                await asyncio.gather(
                    s.aio.step(commands=[["sh", "-c", "echo A >> log"]]),
                    s.aio.step(commands=[["sh", "-c", "echo B >> log"]]),
                    return_exceptions=False,
                )
            )

        try:
            results = client._loop.run(both())
        except SessionError:
            return  # refusing the second call is fine too
        assert sorted(r.commands[0].argv[2] for r in results) == ["echo A >> log", "echo B >> log"]
        assert sorted(s.read_file("log").split()) == [b"A", b"B"]


def test_a_fork_that_fails_part_way_leaves_no_session_open(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.session(TASK, ttl_s=60) as s:
        real_open = AsyncSession.open
        children: list[AsyncSession] = []

        async def flaky_open(self: AsyncSession) -> AsyncSession:
            children.append(self)
            if len(children) == 2:  # say, no worker had a slot for this one
                raise SessionError("simulated: no worker took it")
            return await real_open(self)

        monkeypatch.setattr(AsyncSession, "open", flaky_open)
        try:
            with pytest.raises(SessionError, match="simulated"):
                s.fork(2)
            deadline = time.monotonic() + 15
            while children[0].worker is None and time.monotonic() < deadline:
                time.sleep(0.2)
            leaked = [c for c in children if c.worker is not None and not c.closed]
            assert leaked == []
        finally:
            monkeypatch.undo()
            for child in children:
                if child.worker is not None and not child.closed:
                    client._loop.run(child.close())


# --- two sessions at once -------------------------------------------------------------------


def test_two_sessions_see_neither_each_others_files_nor_processes(client: Client) -> None:
    a, b = client.session(TASK), client.session(TASK)
    try:
        out: dict[str, CommandResult] = {}

        def hold() -> None:
            out["a"] = run(
                a,
                "echo SECRET-A > mine; echo SECRET-A > /tmp/mine; "
                "exec python -c 'import time; time.sleep(4)' MARKER-AAA",
            )

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        time.sleep(1.5)
        probe = run(
            b,
            "grep -qs 'MARKER-[A]AA' /proc/[0-9]*/cmdline && echo SAW-PROCESS; "
            "grep -rqsE 'SECRET-[A]' /workspace /tmp /etc /dev && echo SAW-FILE; "
            "ls /proc | grep -c '^[0-9]'; kill -9 -1; echo end",
        )
        holder.join(30)
        assert "SAW-" not in probe.stdout and probe.stdout.endswith("end\n")
        assert int(probe.stdout.split()[0]) <= 4  # its own pid namespace: bwrap, sh, ls, grep
        result_a = out["a"]
        assert result_a.exit_code == 0 and result_a.wall_s > 3.5  # B's kill -9 -1 missed it
        assert run(a, "whoami").stdout != run(b, "whoami").stdout
        assert a.read_file("mine") == b"SECRET-A\n"
        with pytest.raises(SessionError):
            b.read_file("mine")
    finally:
        a.close()
        b.close()


def test_a_missing_base_checkpoint_is_rejected_with_a_clear_error(client: Client) -> None:
    request = ExecutionRequest.model_validate(
        {
            "request_id": f"redteam-missing-cp-{time.time_ns()}",
            "task": ADD_TASK,
            "files": {"solution.py": CORRECT},
            "base_checkpoint": "0" * 64,
        }
    )
    (result,) = client.run([request], timeout=120)
    assert result.reward is None or result.reward == 0.0
    assert result.status == Status.REJECTED
    assert "base_checkpoint" in (result.error or "")
