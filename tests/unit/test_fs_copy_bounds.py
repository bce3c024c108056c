"""What one copy of a workspace may cost is bounded (issue 22): copy_tree does a few system
calls per entry whatever the depth, and refuses a tree of more entries than a workspace holds,
more data than its size, or one it cannot copy before its deadline. A refusal is an OSError
(ENOSPC), which the runner scores as the policy's ungradable workspace, never masked."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trialbox.sandbox import fs
from trialbox.sandbox.fs import copy_tree, walk_nofollow

UID, GID = os.getuid(), os.getgid()
DEPTH = 60


def no_skip(rel: str, is_dir: bool) -> str | None:
    return None


def _chain(root: Path, name: str, depth: int) -> Path:
    path = root.joinpath(*[name] * depth)
    path.mkdir(parents=True)
    return path


def _counting_opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real: Callable[..., int] = os.open

    def counted(*args: Any, **kwargs: Any) -> int:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    return calls


def test_a_copy_opens_a_few_files_per_entry_at_any_depth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No directory chain reopened per file (or per hard link): 100 files and 100 second
    names 60 directories deep cost what they cost at the top."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    dst.mkdir()
    files, links = _chain(src, "d", DEPTH), _chain(src, "e", DEPTH)
    for i in range(100):
        (files / f"f{i}").write_text(str(i))
        os.link(files / f"f{i}", links / f"l{i}")
    entries = 2 * DEPTH + 200
    opens = _counting_opens(monkeypatch)
    assert copy_tree(src, dst, no_skip, UID, GID, 1 << 30) == []
    monkeypatch.undo()
    assert opens[0] <= 4 * entries, (opens[0], entries)
    deep_files, deep_links = dst.joinpath(*["d"] * DEPTH), dst.joinpath(*["e"] * DEPTH)
    assert (deep_files / "f42").read_text() == "42"
    assert (deep_links / "l42").stat().st_ino == (deep_files / "f42").stat().st_ino


def test_a_hard_link_deeper_than_path_max_is_copied_as_a_link(tmp_path: Path) -> None:
    """Long names 60 deep: the way to the first copy is longer than PATH_MAX."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    name = "n" * 200
    chain = (*[name] * DEPTH,)
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    first = fs.open_dirs(src_fd, chain, UID, GID)
    second = fs.open_dirs(src_fd, ("x", *chain), UID, GID)
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=first))
    os.link("f", "f", src_dir_fd=first, dst_dir_fd=second)
    try:
        assert copy_tree(src, dst, no_skip, UID, GID, 1 << 30) == []
        dst_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        a = fs.open_dirs(dst_fd, chain, UID, GID)  # there already: nothing is created
        b = fs.open_dirs(dst_fd, ("x", *chain), UID, GID)
        assert os.stat("f", dir_fd=a).st_ino == os.stat("f", dir_fd=b).st_ino
        assert os.stat("f", dir_fd=a).st_nlink == 2
        for fd in (dst_fd, a, b):
            os.close(fd)
    finally:
        for fd in (src_fd, first, second):
            os.close(fd)
        fs.remove_tree(src)  # pytest's own cleanup cannot remove a path past PATH_MAX
        fs.remove_tree(dst)


def _flat(root: Path, count: int) -> None:
    root.mkdir()
    (root / "dir").mkdir()
    for i in range(count - 1):
        (root / "dir" / f"f{i}").write_text("")


def test_a_copy_refuses_more_entries_than_a_workspace_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fs, "WORKSPACE_INODES", 40)
    _flat(tmp_path / "full", 40)
    (tmp_path / "dst").mkdir()
    assert copy_tree(tmp_path / "full", tmp_path / "dst", no_skip, UID, GID, 1 << 30) == []
    _flat(tmp_path / "over", 41)
    (tmp_path / "dst2").mkdir()
    with pytest.raises(OSError, match="more than 40 files and directories") as refused:
        copy_tree(tmp_path / "over", tmp_path / "dst2", no_skip, UID, GID, 1 << 30)
    assert refused.value.errno == errno.ENOSPC


def test_a_walk_refuses_a_directory_of_too_many_names_before_it_yields(tmp_path: Path) -> None:
    for i in range(41):
        (tmp_path / f"f{i}").write_text("")
    walk = walk_nofollow(tmp_path, max_entries=10)
    with pytest.raises(OSError, match="more than 10 files and directories"):
        next(walk)


def test_a_copy_refuses_more_data_than_the_workspace_holds(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "dst").mkdir()
    with open(src / "sparse", "wb") as sparse:  # a hole is not data: it copies as a hole
        sparse.truncate(900 << 10)
        sparse.write(b"x" * 1000)
    (src / "a").write_bytes(b"a" * (600 << 10))
    assert copy_tree(src, tmp_path / "dst", no_skip, UID, GID, 1 << 20) == []
    (src / "b").write_bytes(b"b" * (600 << 10))  # each fits, not both
    (tmp_path / "dst2").mkdir()
    with pytest.raises(OSError, match=f"more than {1 << 20} bytes") as refused:
        copy_tree(src, tmp_path / "dst2", no_skip, UID, GID, 1 << 20)
    assert refused.value.errno == errno.ENOSPC


def test_a_copy_stops_at_its_deadline(tmp_path: Path) -> None:
    _flat(tmp_path / "src", 20)
    (tmp_path / "dst").mkdir()
    with pytest.raises(OSError, match="took more than 0 s"):
        copy_tree(tmp_path / "src", tmp_path / "dst", no_skip, UID, GID, 1 << 20, max_s=0)
    (tmp_path / "dst2").mkdir()
    assert copy_tree(tmp_path / "src", tmp_path / "dst2", no_skip, UID, GID, 1 << 20, 60) == []
