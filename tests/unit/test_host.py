"""Host tuning helpers."""

from __future__ import annotations

from trialbox.sandbox.host import cgroup2_mounts


def test_cgroup2_mounts_are_found_with_their_options() -> None:
    text = (
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime,favordynmods 0 0\n"
    )
    assert cgroup2_mounts(text) == [("/sys/fs/cgroup/unified", ["rw", "relatime", "favordynmods"])]
