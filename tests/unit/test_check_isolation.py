"""sandbox_image/check_isolation.py: the operator's Fargate isolation check, run here.

What this machine is known to be decides the expectations: they are read from this process's
own /proc/self/status (and the kernel's sysctls) rather than typed in, and a setpriv run shows
the capability decoding follow a reduced set.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.modules import from_file

SCRIPT = Path(__file__).resolve().parents[2] / "sandbox_image" / "check_isolation.py"
STATUS = re.compile(r"^(ok|absent|denied|error)( \(.+\))?$")
# The worker task's kept capabilities (infra/pool.py KEPT), as setpriv spells them.
TASK_BOUNDING = "-all,+chown,+fowner,+setuid,+setgid,+kill"
NOBODY = 65534


def run(argv: list[str], *, stdin: str | None = None) -> dict[str, Any]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one object, one CloudWatch event
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    return report


def own_status() -> dict[str, str]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def max_user_namespaces() -> int:
    return int(Path("/proc/sys/user/max_user_namespaces").read_text())


def interpreter_for_nobody() -> str:
    # The venv's interpreter may live under a 0700 home; Debian's is world-executable.
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def under_setpriv(*options: str) -> dict[str, Any]:
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs setpriv and root")
    argv = ["setpriv", *options, "--inh-caps=-all", interpreter_for_nobody(), "-"]
    return run(argv, stdin=SCRIPT.read_text())


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run([sys.executable, str(SCRIPT)])


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return from_file("check_isolation", SCRIPT)


def probes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: value for name, value in report.items() if isinstance(value, dict)}


def test_every_probe_reports_a_status(report: dict[str, Any]) -> None:
    assert report["check_isolation"] == 1
    found = probes(report)
    nested = probes(found["as_slot_uid"])
    for name, probe in [*found.items(), *(("as_slot_uid." + k, v) for k, v in nested.items())]:
        assert STATUS.match(probe["status"]), (name, probe)
    expected = {
        "kernel",
        "capabilities",
        "seccomp",
        "no_new_privs",
        "unshare_user",
        "max_user_namespaces",
        "userns_mount_tmpfs",
        "bwrap",
        "ptrace_traceme",
        "ptrace_attach_child",
        "seccomp_filter_no_new_privs",
        "seccomp_trap_sigsys",
        "landlock",
        "landlock_enforce",
        "cgroup",
        "dev_mqueue",
        "keys_maxkeys",
        "suid_dumpable",
        "sysvipc",
        "syscall_table",
        "as_slot_uid",
    }
    assert expected <= set(found)
    # This host's value, which the rlimit backend would refuse if it were 1.
    suid_dumpable = Path("/proc/sys/fs/suid_dumpable").read_text().strip()
    assert str(found["suid_dumpable"].get("value")) == suid_dumpable, found["suid_dumpable"]


def test_the_syscall_table_matches_this_kernel(report: dict[str, Any], script: ModuleType) -> None:
    # getppid through the table's raw number returned this process's parent: the table is
    # right for this architecture. The other architecture's numbers are the kernel's own.
    assert report["syscall_table"]["status"] == "ok"
    assert report["kernel"]["release"] == os.uname().release
    for machine, getppid in (("x86_64", 110), ("aarch64", 173)):
        table = script.SYSCALLS[machine]
        assert table["getppid"] == getppid
        assert [
            table[f"landlock_{n}"] for n in ("create_ruleset", "add_rule", "restrict_self")
        ] == [
            444,
            445,
            446,
        ]


def test_capabilities_decode_this_process_set(report: dict[str, Any]) -> None:
    own = int(own_status()["CapEff"], 16)
    effective = report["capabilities"]["effective"]
    assert int(effective["hex"], 16) == own
    assert len(effective["names"]) == bin(own).count("1")
    assert ("CAP_SYS_ADMIN" in effective["names"]) == bool(own >> 21 & 1)
    assert ("CAP_SETUID" in effective["names"]) == bool(own >> 7 & 1)
    if os.geteuid() == 0:  # this machine: root, every capability but SYS_RESOURCE
        assert "CAP_SYS_ADMIN" in effective["names"]
        assert "CAP_SYS_PTRACE" in effective["names"]


def test_capability_names_agree_with_libcap(report: dict[str, Any], script: ModuleType) -> None:
    # An independent decoder: libcap's capsh. Every bit the kernel defines (0..40), one at a
    # time, and this process's whole effective set as the script reported it.
    if shutil.which("capsh") is None:
        pytest.skip("needs capsh (libcap2-bin)")
    masks = [1 << bit for bit in range(41)] + [int(report["capabilities"]["effective"]["hex"], 16)]
    decoded = {}
    for mask in masks:
        out = subprocess.run(["capsh", f"--decode={mask:#x}"], capture_output=True, text=True)
        names = out.stdout.strip().partition("=")[2]
        decoded[mask] = [name.upper() for name in names.split(",") if name]
    for bit in range(41):
        assert script.decode_caps(1 << bit) == decoded[1 << bit], bit
    assert report["capabilities"]["effective"]["names"] == decoded[masks[-1]]


def test_seccomp_and_no_new_privs_are_this_process(report: dict[str, Any]) -> None:
    status = own_status()
    assert report["seccomp"]["mode"] == int(status["Seccomp"])
    assert report["no_new_privs"]["value"] == int(status["NoNewPrivs"])


def test_unprivileged_primitives_work_here(report: dict[str, Any]) -> None:
    assert report["seccomp_filter_no_new_privs"] == {"status": "ok", "mode_after": 2}
    assert report["seccomp_trap_sigsys"]["status"] == "ok"
    assert report["max_user_namespaces"]["value"] == max_user_namespaces()
    if os.geteuid() == 0 and max_user_namespaces() > 0 and own_status()["Seccomp"] == "0":
        assert report["unshare_user"]["status"] == "ok"
        assert report["userns_mount_tmpfs"]["status"] == "ok"
        assert report["ptrace_attach_child"]["status"] == "ok"


def test_landlock_is_an_abi_or_absent(report: dict[str, Any]) -> None:
    landlock = report["landlock"]
    abi = landlock["abi"]
    if isinstance(abi, int):
        assert landlock["status"] == "ok" and abi >= 1
        assert report["landlock_enforce"]["status"] == "ok"  # and it enforces
    else:
        assert abi.startswith(("absent", "denied")), landlock


def test_the_slot_uid_section_drops_every_capability(report: dict[str, Any]) -> None:
    if os.geteuid() != 0:
        assert report["as_slot_uid"]["status"].startswith("absent")
        return
    slot = report["as_slot_uid"]
    assert slot["status"] == "ok" and slot["uid"] == NOBODY
    assert slot["capabilities"]["effective"] == {"hex": "0000000000000000", "names": []}
    assert slot["seccomp_filter_no_new_privs"]["status"] == "ok"


def test_decoding_follows_a_reduced_set_under_setpriv() -> None:
    reduced = under_setpriv(
        "--bounding-set=-all,+setuid,+setgid",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
    )
    caps = reduced["capabilities"]
    assert caps["effective"] == {"hex": "0000000000000000", "names": []}
    assert "CAP_SYS_ADMIN" not in caps["effective"]["names"]
    assert caps["bounding"]["names"] == ["CAP_SETGID", "CAP_SETUID"]
    assert reduced["identity"]["uid"] == NOBODY
    assert reduced["as_slot_uid"]["status"].startswith("absent")  # already unprivileged
    assert reduced["unshare_mount"]["status"] == "denied (errno EPERM)"


def test_the_task_capability_set_denies_namespaces_to_root() -> None:
    # Root with only the task's kept capabilities: no CAP_SYS_ADMIN, so no mount namespace
    # without a user namespace, whatever the kernel allows.
    reduced = under_setpriv(f"--bounding-set={TASK_BOUNDING}")
    assert reduced["capabilities"]["effective"]["names"] == [
        "CAP_CHOWN",
        "CAP_FOWNER",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
    ]
    assert reduced["unshare_mount"]["status"] == "denied (errno EPERM)"
    assert reduced["unshare_pid_net_ipc_uts"]["status"] == "denied (errno EPERM)"
    if max_user_namespaces() > 0 and tuple(map(int, os.uname().release.split(".")[:2])) >= (5, 12):
        # Mapping uid 0 needs CAP_SETFCAP (Linux 5.12+): root fails where the slot uid succeeds.
        assert reduced["userns_mount_tmpfs"] == {
            "status": "denied (errno EPERM)",
            "step": "uid_map",
        }
        assert reduced["as_slot_uid"]["userns_mount_tmpfs"]["status"] == "ok"


def test_the_script_needs_only_the_standard_library() -> None:
    tree = ast.parse(SCRIPT.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules - {"__future__"} <= sys.stdlib_module_names, modules
    assert "trialbox" not in modules
