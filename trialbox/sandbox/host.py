"""Host tuning that `make setup` applies: speed bought with engineering, never with isolation.

Moving a process into a cgroup takes a write lock on the kernel's threadgroup rwsem. By default
that lock is kept fast for forks, and the first writer after an idle moment waits a full RCU
grace period (measured here: +5.5 ms per sandbox launch after 0.2 s idle, on top of a 10 ms
`python -c pass`). The `favordynmods` cgroup2 mount option (Linux 6.0+) keeps the lock ready
for writers instead. The flag is global, so remounting any cgroup2 mount is enough; cgroup v1
hierarchies cannot change options on remount.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

FEATURES = Path("/sys/kernel/cgroup/features")


def cgroup2_mounts(mounts: str) -> list[tuple[str, list[str]]]:
    """(mount point, options) of every cgroup2 mount in /proc/mounts text."""
    found = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2":
            found.append((fields[1], fields[3].split(",")))
    return found


def favor_dynamic_cgroups() -> str:
    """Turn on `favordynmods` where the kernel supports it. Returns what happened, in words."""
    if not FEATURES.exists() or "favordynmods" not in FEATURES.read_text().split():
        return "cgroup favordynmods: not supported by this kernel (launches after idle are slower)"
    mounts = cgroup2_mounts(Path("/proc/mounts").read_text())
    if not mounts:
        return "cgroup favordynmods: no cgroup2 mount to set it on"
    if any("favordynmods" in options for _, options in mounts):
        return "cgroup favordynmods: already on"
    point = mounts[0][0]
    done = subprocess.run(
        ["mount", "-o", "remount,favordynmods", point], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"cgroup favordynmods: could not remount {point}: {done.stderr.strip()}"
    return f"cgroup favordynmods: turned on ({point})"
