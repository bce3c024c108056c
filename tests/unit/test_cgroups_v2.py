"""Cgroup v2 (and v1) against fake cgroupfs trees: limits written, stats read, kills requested."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from trialbox.errors import SandboxSetupError
from trialbox.sandbox import cgroups
from trialbox.sandbox.cgroups import CgroupStats, CgroupV1, CgroupV2, cgroup_class

NO_SUCH_PID = 999_999_999


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record os.kill calls instead of sending signals."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(cgroups.os, "kill", lambda pid, sig: calls.append((pid, sig)))
    return calls


@pytest.fixture
def v2_root(tmp_path: Path) -> Path:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    # The kernel creates a new cgroup's control files on mkdir; the fake tree needs them up front.
    (tmp_path / "trialbox").mkdir()
    (tmp_path / "trialbox" / "cgroup.subtree_control").write_text("")
    return tmp_path


def test_unified_root_is_v2(v2_root: Path) -> None:
    assert cgroup_class(v2_root) is CgroupV2


def test_v2_create_writes_limits_and_enables_controllers(v2_root: Path) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    slot = v2_root / "trialbox" / "slot-0"
    assert group.dirs == [slot]
    assert group.procs_files == [slot / "cgroup.procs"]
    assert (slot / "memory.max").read_text() == "268435456"
    assert (slot / "memory.swap.max").read_text() == "0"
    assert (slot / "pids.max").read_text() == "64"
    assert (slot / "cpu.max").read_text() == "50000 100000"
    assert (v2_root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (v2_root / "trialbox" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_v2_controllers_already_enabled_are_left_alone(v2_root: Path) -> None:
    (v2_root / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    CgroupV2(v2_root, "trialbox", "slot-1").create(memory_mb=64, pids=8, cpus=2)
    assert (v2_root / "cgroup.subtree_control").read_text() == "cpu io memory pids\n"
    assert (v2_root / "trialbox" / "slot-1" / "cpu.max").read_text() == "200000 100000"


def test_v2_stats(v2_root: Path) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    slot = group.dirs[0]
    (slot / "memory.peak").write_text("157286400\n")
    (slot / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (slot / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert group.stats() == CgroupStats(cpu_s=1.5, peak_memory_mb=150.0, oom_kills=1)


def test_v2_stats_without_files_are_zero(v2_root: Path) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-0")
    assert group.stats() == CgroupStats(cpu_s=0.0, peak_memory_mb=0.0, oom_kills=0)


def test_v2_kill_all_only_writes_cgroup_kill(v2_root: Path, kills: list[tuple[int, int]]) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    slot = group.dirs[0]
    (slot / "cgroup.procs").write_text(f"{NO_SUCH_PID}\n")
    assert group.pids() == {NO_SUCH_PID}
    group.kill_all()
    assert (slot / "cgroup.kill").read_text() == "1"
    assert kills == []
    assert not (slot / "cgroup.freeze").exists()


def test_v2_kill_all_of_an_empty_group_writes_nothing(v2_root: Path) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    (group.dirs[0] / "cgroup.procs").write_text("")
    group.kill_all()
    assert not (group.dirs[0] / "cgroup.kill").exists()


def test_no_cgroups_names_the_missing_controllers(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "cgroup.procs").write_text("")
    with pytest.raises(SandboxSetupError) as exc:
        cgroup_class(tmp_path)
    assert str(exc.value) == (
        f"no usable cgroups under {tmp_path}: controllers memory, cpu, cpuacct, freezer "
        "are not mounted"
    )


def test_empty_dir_lists_every_controller(tmp_path: Path) -> None:
    with pytest.raises(SandboxSetupError) as exc:
        cgroup_class(tmp_path)
    assert str(exc.value) == (
        f"no usable cgroups under {tmp_path}: controllers memory, pids, cpu, cpuacct, freezer "
        "are not mounted"
    )


@pytest.fixture
def v1_root(tmp_path: Path) -> Path:
    for controller in CgroupV1.CONTROLLERS:
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "cgroup.procs").write_text("")
    return tmp_path


def test_v1_create_writes_each_controller(v1_root: Path) -> None:
    assert cgroup_class(v1_root) is CgroupV1
    group = CgroupV1(v1_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    assert group.dirs == [v1_root / c / "trialbox" / "slot-0" for c in CgroupV1.CONTROLLERS]

    def read(controller: str, name: str) -> str:
        return (v1_root / controller / "trialbox" / "slot-0" / name).read_text()

    assert read("memory", "memory.limit_in_bytes") == "268435456"
    assert read("memory", "memory.memsw.limit_in_bytes") == "268435456"
    assert read("pids", "pids.max") == "64"
    assert read("cpu", "cpu.cfs_period_us") == "100000"
    assert read("cpu", "cpu.cfs_quota_us") == "50000"


def test_v1_co_mounted_cpu_and_cpuacct_share_one_dir(tmp_path: Path) -> None:
    for controller in ("memory", "pids", "freezer", "cpu,cpuacct"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "cgroup.procs").write_text("")
    (tmp_path / "cpu").symlink_to("cpu,cpuacct")
    (tmp_path / "cpuacct").symlink_to("cpu,cpuacct")
    group = CgroupV1(tmp_path, "trialbox", "slot-0")
    assert [d.relative_to(tmp_path).parts[0] for d in group.dirs] == [
        "memory",
        "pids",
        "cpu",
        "freezer",
    ]


def test_v1_stats(v1_root: Path) -> None:
    group = CgroupV1(v1_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    memory = v1_root / "memory" / "trialbox" / "slot-0"
    (memory / "memory.max_usage_in_bytes").write_text("52428800\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (v1_root / "cpuacct" / "trialbox" / "slot-0" / "cpuacct.usage").write_text("2500000000\n")
    assert group.stats() == CgroupStats(cpu_s=2.5, peak_memory_mb=50.0, oom_kills=1)


def test_v1_kill_all_freezes_kills_and_thaws(v1_root: Path, kills: list[tuple[int, int]]) -> None:
    group = CgroupV1(v1_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    # The freezer's cgroup.procs is the membership list v1 reads.
    (v1_root / "freezer" / "trialbox" / "slot-0" / "cgroup.procs").write_text(f"{NO_SUCH_PID}\n")
    assert group.pids() == {NO_SUCH_PID}
    group.kill_all()
    assert kills == [(NO_SUCH_PID, signal.SIGKILL)]
    assert (v1_root / "freezer" / "trialbox" / "slot-0" / "freezer.state").read_text() == "THAWED"


def test_v1_reuse_resets_counters_and_oom_baseline(v1_root: Path) -> None:
    group = CgroupV1(v1_root, "trialbox", "slot-0")
    group.create(memory_mb=256, pids=64, cpus=0.5)
    memory = v1_root / "memory" / "trialbox" / "slot-0"
    cpuacct = v1_root / "cpuacct" / "trialbox" / "slot-0"
    (memory / "memory.max_usage_in_bytes").write_text("52428800\n")
    (memory / "memory.oom_control").write_text("oom_kill 1\n")
    (cpuacct / "cpuacct.usage").write_text("2500000000\n")
    group.create(memory_mb=128, pids=32, cpus=1)
    assert (memory / "memory.limit_in_bytes").read_text() == "134217728"
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == "134217728"
    assert (memory / "memory.max_usage_in_bytes").read_text() == "0"
    assert (cpuacct / "cpuacct.usage").read_text() == "0"
    assert group.stats() == CgroupStats(cpu_s=0.0, peak_memory_mb=0.0, oom_kills=0)
    (memory / "memory.oom_control").write_text("oom_kill 3\n")
    assert group.stats().oom_kills == 2


def test_fractional_cpu_quota_is_rounded_not_truncated(v2_root: Path) -> None:
    group = CgroupV2(v2_root, "trialbox", "slot-1")
    group.create(memory_mb=64, pids=8, cpus=0.29)
    assert (v2_root / "trialbox" / "slot-1" / "cpu.max").read_text() == "29000 100000"
