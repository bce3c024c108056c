"""What one copy of a workspace costs at its bounds (fs.copy_tree, in a tmpfs as on bwrap): a
workspace of fs.WORKSPACE_INODES names 63 directories deep (as files, or as hard links to one
file), and one of disk_mb of data. The Execute budget counts each copy at
trialbox.models.performance.copy_s(disk_mb), which must stay well above these figures.

`--git REV` also times the copy_tree of that revision's fs.py, for a before/after.

Run: `.venv/bin/python benchmarks/copy_bound.py [--disk-mb 64] [--git HEAD]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from trialbox.models.performance import copy_s
from trialbox.sandbox import fs

DEPTH = 63


def _deep(root: Path) -> int:
    path = root.joinpath(*["d"] * DEPTH)
    path.mkdir(parents=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def names_tree(root: Path) -> None:
    fd = _deep(root)
    for i in range(fs.WORKSPACE_INODES - DEPTH - 1):
        os.close(os.open(str(i), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)


def links_tree(root: Path) -> None:
    fd = _deep(root)
    os.close(os.open("0", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    other = _deep(root / "e")
    for i in range(fs.WORKSPACE_INODES - 2 * DEPTH - 3):
        os.link("0", str(i), src_dir_fd=fd, dst_dir_fd=other)
    os.close(fd)
    os.close(other)


def data_tree(disk_mb: int) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        root.mkdir()
        block = os.urandom(1 << 20)
        with open(root / "data", "wb") as out:
            for _ in range(disk_mb):
                out.write(block)

    return make


def _module(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:trialbox/sandbox/fs.py"], check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "fs_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("fs_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(copy: Callable[..., object], src: Path, dst: Path, max_bytes: int) -> float:
    dst.mkdir()
    started = time.monotonic()
    copy(src, dst, lambda *_: None, 0, 0, max_bytes)
    spent = time.monotonic() - started
    fs.remove_tree(dst)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--disk-mb", type=int, default=64)
    parser.add_argument("--git", help="also time this revision's copy_tree")
    args = parser.parse_args()
    max_bytes = args.disk_mb << 20
    copies = {"now": fs.copy_tree}
    if args.git:
        copies[args.git] = _module(args.git).copy_tree
    cases = {
        f"{fs.WORKSPACE_INODES} names {DEPTH} deep": names_tree,
        f"{fs.WORKSPACE_INODES} hard links {DEPTH} deep": links_tree,
        f"{args.disk_mb} MiB of data": data_tree(args.disk_mb),
    }
    print(f"load {os.getloadavg()[0]:.1f}; copy_s({args.disk_mb}) = {copy_s(args.disk_mb):g} s")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as scratch:
        for case, make in cases.items():
            src = Path(scratch, "src")
            make(src)
            for label, copy in copies.items():
                spent = _time(copy, src, Path(scratch, "dst"), max_bytes)
                print(f"{case:>32}: {label:>6} {spent:6.2f} s", flush=True)
            fs.remove_tree(src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
