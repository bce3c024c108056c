"""The process tree, read from /proc: what tests look for among their own processes."""

from __future__ import annotations

from pathlib import Path


def cmdline(pid: int) -> list[str]:
    """A process's argv; [] once it ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:  # it ended meanwhile
        return []


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for child in children_of(pid):
        found |= {child} | descendants(child)
    return found


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
