"""Red-team cases against the rlimit backend under the task definition's constraints: what
model-written code, as a slot uid, can do to the next job on the same worker, or to the worker.
One slot (TRIALBOX_SANDBOX_SLOTS=1), so the next job even runs as the same uid. Each test
asserts the safe outcome; a test that fails names a break.

Each was a break when first written, and is fixed:
- the hunter (HUNTER): a process of a job's uid races the worker's clean-up. The worker used
  to fork a child that switched to the slot uid and only then called kill(-1); in between, a
  process of that uid could signal it (SIGKILLed: no clean-up; SIGSTOPped: the worker waited
  forever), and one whose thread-group leader exited alone (SYS_exit, other threads running)
  showed as a zombie that `processes_of` skipped. Kills now come from root
  (trialbox/sandbox/processes.py), which counts thread groups by their tasks. These race the
  scheduler; tests/sandbox/test_rlimit_redteam.py shows both without the race;
- a directory tree deeper than Python's recursion limit made `shutil.rmtree` (3.11, recursive)
  raise RecursionError in the worker's release and wipe (now `fs.remove_tree`, iterative);
- odd leftovers the wipe does handle (names with a newline, non-UTF-8 bytes or a leading '-',
  a chmod 000 directory with content, fifos, socket files, hard links, long paths, abstract
  sockets, memfd, inotify): regression guards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.fargate.harness import Harness, Service
from tests.fargate.programs import PROBE
from tests.fargate.submit import describe, python, request, run_jobs
from tests.support.programs import hunter
from tests.support.tasks import CORRECT
from trialbox.models import Status
from trialbox.sdk import Client

ONE_SLOT = {"TRIALBOX_SANDBOX_SLOTS": "1"}
# The next job: waits for a hunter to act, then shows its workspace.
LOOK = (
    "import os, time\n"
    "time.sleep(2)\n"
    f"print(sorted(os.listdir('.')), open('solution.py').read() == {CORRECT!r})\n"
)

# Deeper than CPython 3.11's recursion limit (1000): in the workspace, /tmp and /dev/shm.
DEEP = (
    "import os\n"
    "for top in (os.getcwd(), '/tmp', '/dev/shm'):\n"
    "    os.chdir(top)\n"
    "    os.mkdir(f'deep-{os.getpid()}')\n"
    "    os.chdir(f'deep-{os.getpid()}')\n"
    "    for _ in range(1500):\n"
    "        os.mkdir('d')\n"
    "        os.chdir('d')\n"
    "    open('leaf', 'w').write('x')\n"
    "print('deep')\n"
)

# Odd leftovers the wipe must remove anyway; the processes holding an abstract socket, a memfd
# and an inotify watch are left running. Prints what it left.
ODD = r"""
import ctypes, os, signal, socket, time
left = []
for d in ("/tmp", "/dev/shm"):
    names = [b"trialbox-leftover\nnewline", b"trialbox-leftover-\xff\xfe", b"-rf", b"--help"]
    for name in names:
        with open(os.path.join(d.encode(), name), "wb") as f:
            f.write(b"x")
    locked = os.path.join(d, "trialbox-leftover-000")
    os.makedirs(os.path.join(locked, "inner"))
    open(os.path.join(locked, "inner", "secret"), "w").write("x")
    os.chmod(os.path.join(locked, "inner"), 0)
    os.chmod(locked, 0)
    os.mkfifo(os.path.join(d, "trialbox-leftover-fifo"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(d, "trialbox-leftover-sock"))
    os.link(os.path.join(d.encode(), b"-rf"), os.path.join(d, "trialbox-leftover-link"))
    os.symlink("/etc/passwd", os.path.join(d, "trialbox-leftover-symlink"))
    long = os.path.join(d, "trialbox-leftover-long")
    os.mkdir(long)
    fd = os.open(long, os.O_RDONLY)
    for _ in range(40):  # a path far past PATH_MAX
        os.mkdir("x" * 200, dir_fd=fd)
        nfd = os.open("x" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    left.append(d)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        abstract = socket.socket(socket.AF_UNIX)
        abstract.bind(f"\0trialbox-leftover-{os.getuid()}")  # the slot's: no other suite's
        abstract.listen()
        memfd = os.memfd_create("trialbox-leftover")
        os.write(memfd, b"x")
        libc = ctypes.CDLL(None)
        ino = libc.inotify_init()
        libc.inotify_add_watch(ino, b"/tmp", 0xFFF)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
    os._exit(0)
time.sleep(0.2)
print("left:", " ".join(left))
"""

ABSTRACT_PROBE = (
    "import os, socket\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "try:\n"
    "    s.connect(f'\\0trialbox-leftover-{os.getuid()}')\n"
    "    print('abstract socket still bound')\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n"
)


@pytest.fixture
def one_slot(harness: Harness) -> Iterator[Service]:
    """A fresh one-slot worker for each case: a case may wedge or dirty it."""
    running = harness.service(ONE_SLOT)
    try:
        yield running
    finally:
        with contextlib.suppress(AssertionError):  # a wedged worker is killed, then this
            running.stop()


def test_a_hidden_process_cannot_survive_into_the_next_job(
    client: Client, one_slot: Service
) -> None:
    """Was a break: the hunter killed every clean-up child of its uid and hid from
    `processes_of`; the wipe and `residue` reported nothing, the worker took the next job, and
    the hunter rewrote that job's solution.py (reward 0 for a correct sample)."""
    (left,) = run_jobs(client, one_slot, [request(commands=[python(hunter("kill"))])])
    assert left.status == Status.SUCCEEDED, describe(left)
    nxt = request(files={"solution.py": CORRECT}, commands=[python(LOOK)], grade=True)
    (victim,) = run_jobs(client, one_slot, [nxt])
    assert victim.status == Status.SUCCEEDED, describe(victim)
    assert victim.commands[0].stdout == "['solution.py'] True\n", describe(victim)
    assert victim.reward == 1.0, describe(victim)


def test_a_stopped_cleanup_child_cannot_wedge_the_worker(client: Client, one_slot: Service) -> None:
    """Was a break: the hunter SIGSTOPped the worker's kill(-1) child after its uid switch; the
    worker waited for it forever (heartbeats still flowing), and its own job got no result."""
    (left,) = run_jobs(client, one_slot, [request(commands=[python(hunter("stop"))])], timeout=45)
    assert left.status == Status.SUCCEEDED, describe(left)
    (after,) = run_jobs(client, one_slot, [request(commands=[python("print('ok')")])], timeout=45)
    assert after.status == Status.SUCCEEDED and after.commands[0].stdout == "ok\n"


def test_a_deep_tree_is_wiped_without_a_sandbox_error(client: Client, one_slot: Service) -> None:
    """Was a break: shutil.rmtree (Python 3.11) recurses once per level, so the release of a
    workspace 1500 levels deep raised RecursionError: the job that made it got `sandbox_error`
    (no reward: a way out of a 0 for the policy), and the worker had to recycle."""
    (deep,) = run_jobs(client, one_slot, [request(commands=[python(DEEP)])])
    assert deep.status == Status.SUCCEEDED, describe(deep)
    assert deep.commands[0].stdout == "deep\n"
    (probe,) = run_jobs(client, one_slot, [request(commands=[python(PROBE)])])
    assert probe.commands[0].stdout == "nothing found\n", describe(probe)
    ran = [one_slot.run_at(r.timings.started_at or 0) for r in (deep, probe)]
    assert ran[0] == ran[1], (ran, one_slot.logs())  # wiped, not recycled


def test_odd_leftovers_are_wiped(client: Client, one_slot: Service) -> None:
    """Holds today: odd names, a 000 directory, fifos, sockets, links, long paths, and the
    processes holding an abstract socket, a memfd and an inotify watch are all gone."""
    (left,) = run_jobs(client, one_slot, [request(commands=[python(ODD)])])
    assert left.status == Status.SUCCEEDED, describe(left)
    assert left.commands[0].stdout == "left: /tmp /dev/shm\n", describe(left)
    (probe, abstract) = run_jobs(
        client,
        one_slot,
        [request(commands=[python(PROBE)]), request(commands=[python(ABSTRACT_PROBE)])],
    )
    assert probe.commands[0].stdout == "nothing found\n", describe(probe)
    assert abstract.commands[0].stdout == "ConnectionRefusedError\n", describe(abstract)
    ran = {one_slot.run_at(r.timings.started_at or 0) for r in (left, probe, abstract)}
    assert len(ran) == 1, (ran, one_slot.logs())  # wiped, not recycled
    assert one_slot.failures() == []
