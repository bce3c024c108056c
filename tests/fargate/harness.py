"""Run the image as Fargate runs the worker container, with the constraints read from the
synthesized task definition:

- capabilities: the bounding set is Docker's default set minus `Capabilities.Drop` plus
  `Capabilities.Add`, so root's permitted and effective sets after exec are exactly that;
- the container `User` (none: root);
- `ReadonlyRootFilesystem`: the image's layers as a read-only overlay root in a new mount,
  pid, IPC and UTS namespace, with a fresh /proc (Docker's masked and read-only paths), a
  minimal /dev (null, zero, full, random, urandom, tty, devpts, a /dev/shm tmpfs, an mqueue
  mount), /sys read-only, and each `MountPoints[].ContainerPath` an empty bind mount of a
  fresh host directory, root 0755, as Fargate's task-storage bind mounts are (the image
  declares no VOLUME to copy from);
- `InitProcessEnabled`: the host's tini as pid 1 (Fargate injects its init; it is not in the
  image);
- the environment: the image's (Docker's PATH plus the Dockerfile's ENV), the template's
  `Environment` with its Refs resolved to the twin's resources, what Fargate adds (region,
  execution env, metadata URIs and a credentials URI), and the twin's endpoint with static
  keys. The credentials URI and both keys are random canaries no sandboxed process may read;
- the image's contents only: everything the worker runs comes from the rootfs.

The network is not unshared: the worker reaches the twin's moto on 127.0.0.1.

Each test session also gets its own slot uid range (TRIALBOX_SANDBOX_UID_BASE): on Fargate a
task has a kernel of its own, here all containers share the host's, and its per-uid state
(process counts for RLIMIT_NPROC, user keyrings) must not mix with another session's. For
the same reason a fresh container starts with the range's user keyrings cleared, as a fresh
microVM would.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fargate.image import NSINIT, Image
from tests.fargate.taskdef import Container
from tests.support.pools import reserve
from trialbox import constants as c
from trialbox.local.resources import REGION, Resolver
from trialbox.sandbox.config import ENV_PREFIX, SandboxConfig
from trialbox.sandbox.fs import remove_tree
from trialbox.sandbox.processes import processes_of

SAMPLER = Path(__file__).with_name("sampler.py")
WAKE = "trialbox-fargate-harness: wake the long poll"
# The volume's mode on Fargate: "by default, the volume permissions are set to 0755 and the
# owner as root" (ECS developer guide, bind mounts), unless the image declares a VOLUME there.
VOLUME_MODE = 0o755
CLEAR_KEYRINGS = """
import ctypes, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
for uid in map(int, sys.argv[1:]):
    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
        for ring in (-4, -5):  # the user and user-session keyrings (KEYCTL_CLEAR = 7)
            libc.syscall(KEYCTL, 7, ring)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def discard(path: Path) -> None:
    """Remove a container's directory, at any depth (a job may leave a tree deeper than the
    recursion limit in a volume), ignoring what cannot be removed."""
    with contextlib.suppress(OSError):
        remove_tree(path)


@dataclass
class Canaries:
    access_key: str = field(default_factory=lambda: "AKIA" + secrets.token_hex(8).upper())
    secret_key: str = field(default_factory=lambda: "canary-secret-" + secrets.token_hex(16))
    credentials_uri: str = field(
        default_factory=lambda: f"/v2/credentials/canary-{secrets.token_hex(16)}"
    )

    def values(self) -> list[str]:
        return [self.access_key, self.secret_key, self.credentials_uri]

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": self.credentials_uri,
        }

    def in_text(self, text: str) -> list[str]:
        return [v for v in self.values() if v in text]


def resolve_environment(
    template: dict[str, Any], container: Container, twin: Any
) -> dict[str, str]:
    """The template's `Environment`, its intrinsics resolved against the twin's resources
    (created from the same template, with the same names)."""
    resolver = Resolver(template)
    sqs = twin.client("sqs")
    for logical, resource in template["Resources"].items():
        if resource["Type"] == "AWS::SQS::Queue":
            url = sqs.get_queue_url(QueueName=logical)["QueueUrl"]
            resolver.set_queue_url(logical, url)
    return {name: str(resolver.resolve(value)) for name, value in container.environment.items()}


@dataclass
class Run:
    """One container; `stop()` is SIGTERM to its init, then a wait."""

    process: subprocess.Popen[bytes]
    directory: Path
    log: Path
    hostname: str
    started_at: float
    queue_urls: tuple[str, ...]  # what the worker long-polls (jobs, session opens): woken on stop
    sqs: Any
    ended_at: float | None = None

    @property
    def init_pid(self) -> int | None:
        """The host pid of the container's pid 1 (unshare's child)."""
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            first = children.read_text().split()
        except OSError:
            return None
        return int(first[0]) if first else None

    def exited(self) -> bool:
        if self.process.poll() is not None and self.ended_at is None:
            self.ended_at = time.time()
        return self.process.returncode is not None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 30) -> int:
        if not self.exited():
            pid = self.init_pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                for queue_url in self.queue_urls:  # end the 20 s long polls now
                    self.sqs.send_message(QueueUrl=queue_url, MessageBody=WAKE)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"the container did not stop within {timeout} s of SIGTERM:\n"
                    + self.output()[-3000:]
                ) from None
        self.exited()
        self._cleanup()
        return self.process.returncode

    def kill(self) -> None:
        pid = self.init_pid
        if pid is not None:  # the namespace's init: everything in it goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.exited()
        self._cleanup()

    def _cleanup(self) -> None:
        discard(self.directory)
        for queue_url in self.queue_urls:
            drop_wake_messages(self.sqs, queue_url)


def drop_wake_messages(sqs: Any, queue_url: str) -> None:
    for _ in range(3):
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = answer.get("Messages", [])
        if not messages:
            return
        for message in messages:
            if message["Body"] == WAKE:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            else:  # a real job: put it back at once
                sqs.change_message_visibility(
                    QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )


class Service:
    """One worker at a time, replaced when it exits (as ECS replaces a task that stopped):
    a worker that recycles after N jobs gets a fresh container for the next. Of a harness's
    services only one runs at a time (Harness.activate): they share its work queue, and a
    test's jobs must reach the worker it made for them."""

    def __init__(
        self, harness: Harness, extra_env: dict[str, str], drop_also: frozenset[str]
    ) -> None:
        self.harness = harness
        self.extra_env = extra_env
        self.drop_also = drop_also
        self.runs: list[Run] = []
        self._want = False
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def resume(self) -> None:
        """Start a container, and replace it whenever it exits, until paused."""
        if self.running:
            return
        self._want = True
        self._start_one()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def _start_one(self) -> None:
        run = self.harness.start_worker(self.extra_env, self.drop_also)
        with self._lock:
            self.runs.append(run)

    def _supervise(self) -> None:
        while self._want:
            current = self.runs[-1]
            if current.exited():
                current._cleanup()
                if len(self.failures()) >= 3:
                    return  # a crash loop: the tests report it
                with self._lock:
                    if self._want:
                        self._start_one()
            time.sleep(0.05)

    def run_at(self, when: float) -> int | None:
        """Which container (index in `runs`) was running at epoch `when`."""
        for index, run in enumerate(self.runs):
            if run.started_at <= when and (run.ended_at is None or when <= run.ended_at):
                return index
        return None

    def failures(self) -> list[str]:
        """Containers that ended other than by recycling or a stop (exit 0)."""
        return [
            f"container {i} exited {run.process.returncode}:\n{run.output()[-3000:]}"
            for i, run in enumerate(self.runs)
            if run.exited() and run.process.returncode != 0
        ]

    def logs(self) -> str:
        return "\n".join(
            f"--- container {i}\n{r.output()[-4000:]}" for i, r in enumerate(self.runs)
        )

    def pause(self) -> list[int]:
        """Stop the container (SIGTERM, as ECS stops a task) and start no other."""
        with self._lock:
            self._want = False
        if self._thread is not None:
            self._thread.join(timeout=10)
        return [run.stop() for run in self.runs]

    def stop(self) -> list[int]:
        if self in self.harness.services:
            self.harness.services.remove(self)
        return self.pause()


class Harness:
    def __init__(
        self,
        image: Image,
        container: Container,
        template: dict[str, Any],
        twin: Any,
        workdir: Path,
    ) -> None:
        self.image = image
        self.container = container
        self.twin = twin
        self.workdir = workdir
        self.canaries = Canaries()
        self.uid_base = reserve().uid_base  # no other runner's, machine-wide
        self.template_env = resolve_environment(template, container, twin)
        self.sqs = twin.client("sqs")
        self._count = 0
        self.services: list[Service] = []  # made and not stopped; one runs at a time

    @property
    def capabilities(self) -> frozenset[str]:
        return self.container.capabilities

    def environment(self, extra_env: dict[str, str] | None = None) -> dict[str, str]:
        """What the worker's process gets, lowest precedence first."""
        fargate = {  # what Fargate's agent adds to every container
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EXECUTION_ENV": "AWS_ECS_FARGATE",
            "ECS_CONTAINER_METADATA_URI": "http://169.254.170.2/v3/harness",
            "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/harness",
        }
        local = {"AWS_ENDPOINT_URL": self.twin.endpoint_url}
        session = {f"{ENV_PREFIX}UID_BASE": str(self.uid_base)}
        env = {"HOME": "/root", **self.image.env, **self.template_env, **fargate}
        return env | self.canaries.env() | local | session | (extra_env or {})

    def slot_uids(self, env: dict[str, str] | None = None) -> range:
        env = env or self.environment()
        slots = int(env.get(f"{ENV_PREFIX}SLOTS", SandboxConfig.model_fields["slots"].default))
        return range(self.uid_base, self.uid_base + 2 * slots)

    def lasting_processes(self, within_s: float = 10.0) -> list[int]:
        """The slot uids' processes that are still there after `within_s`: after a job's
        result, the worker's own clean-up (the wipe's and the residue check's children, which
        become a slot uid for a moment) may still be running, and is not a process that
        outlived the job."""
        deadline = time.monotonic() + within_s
        while (found := processes_of(tuple(self.slot_uids()))) and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    def clear_kernel_state(self) -> None:
        """What a fresh microVM would not have: this session's slot uids' user keyrings."""
        uids = [str(u) for u in self.slot_uids(self.environment({f"{ENV_PREFIX}SLOTS": "1024"}))]
        subprocess.run([sys.executable, "-c", CLEAR_KEYRINGS, *uids], check=True, timeout=60)

    def _spec(
        self,
        argv: list[str],
        env: dict[str, str],
        drop_also: frozenset[str],
        directory: Path,
        hostname: str,
    ) -> dict[str, Any]:
        volumes_by_name = {v["Name"]: v for v in self.container.volumes}
        volumes = []
        for point in self.container.mount_points:
            declared = volumes_by_name.get(point["SourceVolume"])
            if declared is None or set(declared) != {"Name"}:
                raise AssertionError(
                    f"volume {point['SourceVolume']!r} is not a plain task-storage bind mount "
                    f"({declared}); the harness emulates only those"
                )
            source = directory / f"volume-{point['SourceVolume']}"
            path = point["ContainerPath"]
            in_image = next(
                (Path(layer) / path.lstrip("/") for layer in self.image.lower
                 if (Path(layer) / path.lstrip("/")).is_dir()),
                None,
            )  # fmt: skip
            if path in self.image.volumes and in_image is not None:
                # A VOLUME at the same path: ECS copies the image's directory, mode included.
                shutil.copytree(in_image, source, symlinks=True)
                shutil.copystat(in_image, source)
                owner = in_image.stat()
                os.chown(source, owner.st_uid, owner.st_gid)
            else:
                source.mkdir(mode=VOLUME_MODE)
                source.chmod(VOLUME_MODE)
            volumes.append(
                {
                    "path": point["ContainerPath"],
                    "source": str(source),
                    "readonly": bool(point.get("ReadOnly", False)),
                }
            )
        resolv = Path("/etc/resolv.conf")
        return {
            "mode": "container",
            "lower": self.image.lower,
            "scratch": str(directory / "scratch"),
            "volumes": volumes,
            "readonly_root": self.container.readonly_root,
            "capabilities": sorted(self.capabilities - drop_also),
            "user": self.container.user or self.image.user,
            "workdir": self.image.workdir,
            "hostname": hostname,
            "etc": {
                "/etc/resolv.conf": resolv.read_text() if resolv.exists() else "",
                "/etc/hostname": hostname + "\n",
                "/etc/hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.0.1\t{hostname}\n",
            },
            "argv": argv,
            "env": env,
        }

    def _launch(
        self,
        argv: list[str],
        extra_env: dict[str, str] | None,
        drop_also: frozenset[str],
        stdout: Any,
    ) -> tuple[subprocess.Popen[bytes], Path, str]:
        self._count += 1
        directory = Path(tempfile.mkdtemp(prefix=f"c{self._count}-", dir=self.workdir))
        (directory / "scratch").mkdir()
        hostname = f"ip-10-0-{self._count // 250}-{self._count % 250}"
        env = self.environment(extra_env) | {"HOSTNAME": hostname}
        spec = self._spec(argv, env, drop_also, directory, hostname)
        (directory / "spec.json").write_text(json.dumps(spec))
        init = [shutil.which("tini") or "tini", "--"] if self.container.init_process else []
        command = ["unshare", "--mount", "--pid", "--ipc", "--uts", "--fork"]
        command += ["--propagation", "private", "--kill-child"]
        command += [*init, sys.executable, str(NSINIT), str(directory / "spec.json")]
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not subprocess.PIPE else subprocess.PIPE,
            env=env,
        )
        return process, directory, hostname

    def start_worker(
        self, extra_env: dict[str, str] | None = None, drop_also: frozenset[str] = frozenset()
    ) -> Run:
        """The image's ENTRYPOINT, as the task runs it."""
        self.clear_kernel_state()
        argv = self.image.entrypoint + self.image.cmd
        log_dir = Path(tempfile.mkdtemp(prefix="log-", dir=self.workdir))
        log = log_dir / "worker.log"
        with log.open("wb") as out:
            process, directory, hostname = self._launch(argv, extra_env, drop_also, out)
        shutil.move(str(log_dir), directory / "log")
        return Run(
            process=process,
            directory=directory,
            log=directory / "log" / "worker.log",
            hostname=hostname,
            started_at=time.time(),
            queue_urls=tuple(
                url
                for name in (c.ENV_WORK_QUEUE_URL, c.ENV_OPEN_QUEUE_URL)
                if (url := self.template_env.get(name))
            ),
            sqs=self.sqs,
        )

    def service(
        self, extra_env: dict[str, str] | None = None, drop_also: frozenset[str] = frozenset()
    ) -> Service:
        """A service of its own for a test; every other service of the harness pauses."""
        made = Service(self, extra_env or {}, drop_also)
        self.services.append(made)
        self.activate(made)
        return made

    def activate(self, chosen: Service) -> None:
        """Pause every other service (their workers poll the same queue), then run `chosen`."""
        for other in self.services:
            if other is not chosen:
                other.pause()
        chosen.resume()

    def run_in_container(
        self,
        argv: list[str],
        extra_env: dict[str, str] | None = None,
        drop_also: frozenset[str] = frozenset(),
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """One command in a container of the task (its entrypoint replaced, as with
        `docker run --entrypoint`)."""
        process, directory, _ = self._launch(argv, extra_env, drop_also, subprocess.PIPE)
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            discard(directory)
        return subprocess.CompletedProcess(
            argv, process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    @contextlib.contextmanager
    def sampling(self) -> Iterator[dict[str, Any]]:
        """Sample /proc/*/environ and cmdline of every slot-uid process from the host while
        the body runs; yields a dict that holds {"found": ..., "samples": n} afterwards."""
        uids = self.slot_uids(self.environment({f"{ENV_PREFIX}SLOTS": "1024"}))
        process = subprocess.Popen(
            [sys.executable, str(SAMPLER), str(uids.start), str(uids.stop)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps(self.canaries.values()) + "\n")
        process.stdin.flush()
        outcome: dict[str, Any] = {}
        try:
            yield outcome
        finally:
            out, _ = process.communicate(timeout=30)
            outcome.update(json.loads(out))
