"""The harness applies what the task definition says: shown from inside a container."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fargate.harness import Harness
from tests.fargate.nsinit import CAPS
from tests.fargate.taskdef import Container


def mask(names: frozenset[str]) -> int:
    return sum(1 << CAPS.index(name) for name in names)


def sh(harness: Harness, script: str) -> subprocess.CompletedProcess[str]:
    done = harness.run_in_container(["/bin/sh", "-c", script])
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_capabilities_are_the_template_set(harness: Harness, container: Container) -> None:
    done = sh(harness, "id -u; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status")
    uid, *caps = done.stdout.splitlines()
    got = {line.split(":")[0]: int(line.split()[1], 16) for line in caps}
    want = mask(container.capabilities)
    assert uid == "0"  # no User in the task definition: root
    assert got == {"CapInh": 0, "CapPrm": want, "CapEff": want, "CapBnd": want, "CapAmb": 0}


def test_root_is_read_only_and_only_the_volumes_are_writable(
    harness: Harness, container: Container
) -> None:
    volumes = [p["ContainerPath"] for p in container.mount_points]
    script = "for d in / /etc /opt/trialbox /var/tmp /root " + " ".join(volumes) + "; do "
    script += 'if touch "$d/.w" 2>/dev/null; then echo "$d writable $(stat -c %a "$d")"; '
    script += 'else echo "$d read-only"; fi; done'
    lines = sh(harness, script).stdout.splitlines()
    fixed = ("/", "/etc", "/opt/trialbox", "/var/tmp", "/root")
    want = [f"{d} read-only" for d in fixed]
    want += [f"{v} writable {volume_mode(harness, v)}" for v in volumes]
    assert lines == want


def volume_mode(harness: Harness, path: str) -> str:
    """Fargate's empty bind mount is root's 0755, unless the image declares a VOLUME there
    (then ECS copies the image's directory, mode included)."""
    if path not in harness.image.volumes:
        return "755"
    for layer in harness.image.lower:
        found = Path(layer) / path.lstrip("/")
        if found.is_dir():
            return f"{found.stat().st_mode & 0o7777:o}"
    raise AssertionError(f"VOLUME {path} is not a directory in the image")


def test_pid_1_is_an_init_outside_the_image(harness: Harness, container: Container) -> None:
    done = sh(harness, "cat /proc/1/comm; ls /proc | grep -cE '^[0-9]+$'")
    comm, count = done.stdout.split()
    assert container.init_process and comm == "tini"
    assert int(count) <= 4  # tini, sh, ls, grep: a pid namespace of its own


def test_environment_is_the_image_plus_the_template(harness: Harness, container: Container) -> None:
    done = sh(harness, "env -0")
    env = dict(item.split("=", 1) for item in done.stdout.split("\0") if item)
    for name, value in harness.template_env.items():
        assert env[name] == value
    for name, value in harness.image.env.items():
        if name not in container.environment:
            assert env[name] == value
    assert env["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] == harness.canaries.credentials_uri
    assert env["TRIALBOX_WORK_QUEUE_URL"] == harness.twin.outputs["WorkQueueUrl"]


def test_the_image_has_the_twins_interpreter(harness: Harness) -> None:
    inside = sh(harness, "/usr/bin/python3 --version; . /etc/os-release; echo $VERSION_CODENAME")
    host = subprocess.run(["/usr/bin/python3", "--version"], capture_output=True, text=True)
    assert inside.stdout.splitlines() == [host.stdout.strip(), "bookworm"]


def test_dev_is_minimal(harness: Harness) -> None:
    done = sh(
        harness,
        "ls /dev | tr '\\n' ' '; echo; grep -E ' /dev/(shm|mqueue) ' /proc/mounts | cut -d' ' -f3",
    )
    names, *kinds = done.stdout.splitlines()
    assert set(names.split()) == {
        "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr",
        "stdin", "stdout", "tty", "urandom", "zero",
    }  # fmt: skip
    assert kinds == ["tmpfs", "mqueue"]
