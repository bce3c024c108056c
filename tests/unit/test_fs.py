"""Workspace files never followed through symlinks: write_files, copy_tree, checkpoint and
restore."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from trialbox.models import EncodedFile
from trialbox.sandbox.fs import (
    BadCheckpoint,
    checkpoint,
    copy_tree,
    remove_tree,
    restore,
    write_files,
)

UID, GID = os.getuid(), os.getgid()


def no_skip(rel: str, is_dir: bool) -> str | None:
    return None


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_write_files_creates_dirs_and_modes(tmp_path: Path) -> None:
    files = {"a.py": "x = 1\n", "pkg/sub/run.sh": EncodedFile(base64="aGk=", mode="0755")}
    write_files(tmp_path, files, UID, GID)
    assert (tmp_path / "a.py").read_text() == "x = 1\n"
    assert mode(tmp_path / "a.py") == 0o644
    assert (tmp_path / "pkg" / "sub" / "run.sh").read_bytes() == b"hi"
    assert mode(tmp_path / "pkg" / "sub" / "run.sh") == 0o755
    assert mode(tmp_path / "pkg") == 0o755


def test_write_files_replaces_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("old")
    (tmp_path / "a.py").chmod(0o600)
    write_files(tmp_path, {"a.py": "new"}, UID, GID)
    assert (tmp_path / "a.py").read_text() == "new"
    assert mode(tmp_path / "a.py") == 0o644


def test_write_files_replaces_a_symlinked_directory_without_following_it(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "tests").symlink_to(outside)
    write_files(ws, {"tests/x.py": "a"}, UID, GID)
    assert list(outside.iterdir()) == []
    assert not (ws / "tests").is_symlink() and (ws / "tests" / "x.py").read_text() == "a"


def test_write_files_replaces_a_symlink_at_the_file_position(tmp_path: Path) -> None:
    ws, target = tmp_path / "ws", tmp_path / "target.txt"
    ws.mkdir()
    target.write_text("precious")
    (ws / "a.py").symlink_to(target)
    write_files(ws, {"a.py": "agent"}, UID, GID)
    assert not (ws / "a.py").is_symlink()
    assert (ws / "a.py").read_text() == "agent"
    assert target.read_text() == "precious"


def test_write_files_replaces_a_directory_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "a.py").mkdir()
    (tmp_path / "a.py" / "inner").write_text("agent")
    (tmp_path / "tests").write_text("a file where a directory must go")
    write_files(tmp_path, {"a.py": "x", "tests/t.py": "y"}, UID, GID)
    assert (tmp_path / "a.py").read_text() == "x"
    assert (tmp_path / "tests" / "t.py").read_text() == "y"


def test_copy_tree_copies_files_and_leaves_out_symlinks(tmp_path: Path) -> None:
    src, dst, secret = tmp_path / "src", tmp_path / "dst", tmp_path / "secret"
    src.mkdir()
    dst.mkdir()
    secret.write_text("do not copy")
    (src / "sub").mkdir()
    (src / "plain.py").write_text("plain")
    (src / "sub" / "tool.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "tool.sh").chmod(0o700)
    (src / "link.txt").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)
    left_out = copy_tree(src, dst, no_skip, UID, GID, 1 << 30)
    assert left_out == [
        ("dirlink", "symlink: not copied into the grading tree"),
        ("link.txt", "symlink: not copied into the grading tree"),
    ]
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == [
        "plain.py",
        "sub",
        "sub/tool.sh",
    ]
    assert (dst / "plain.py").read_text() == "plain"
    assert mode(dst / "plain.py") == 0o644
    assert (dst / "sub" / "tool.sh").read_text() == "#!/bin/sh\n"
    assert mode(dst / "sub" / "tool.sh") == 0o755


def test_copy_tree_applies_skip_to_files_and_whole_dirs(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "__pycache__").mkdir(parents=True)
    dst.mkdir()
    (src / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\x00")
    (src / "conftest.py").write_text("boom")
    (src / "solution.py").write_text("ok")

    def skip(rel: str, is_dir: bool) -> str | None:
        if rel == "__pycache__":
            return "bytecode cache"
        return "hook" if rel == "conftest.py" else None

    assert copy_tree(src, dst, skip, UID, GID, 1 << 30) == [
        ("__pycache__", "bytecode cache"),
        ("conftest.py", "hook"),
    ]
    assert sorted(p.name for p in dst.iterdir()) == ["solution.py"]


def test_checkpoint_stores_symlinks_as_links(tmp_path: Path) -> None:
    ws, secret = tmp_path / "ws", tmp_path / "secret.txt"
    (ws / "pkg").mkdir(parents=True)
    secret.write_text("TOP SECRET")
    (ws / "pkg" / "a.py").write_text("print(1)\n")
    (ws / "leak").symlink_to(secret)
    data = checkpoint(ws)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["leak", "pkg", "pkg/a.py"]
        assert members["leak"].type == tarfile.SYMTYPE
        assert members["leak"].linkname == str(secret)
        assert members["leak"].size == 0
        assert members["pkg"].type == tarfile.DIRTYPE
        extracted = tar.extractfile(members["pkg/a.py"])
        assert extracted is not None
        assert extracted.read() == b"print(1)\n"
    assert b"TOP SECRET" not in data
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        contents = [tar.extractfile(m) for m in tar.getmembers() if m.isfile()]
        assert [f.read() for f in contents if f is not None] == [b"print(1)\n"]


def test_remove_tree_takes_any_depth_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    root = tmp_path / "tree"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):  # deeper than Python's recursion limit and than PATH_MAX
            os.mkdir("d" * 20, dir_fd=fd)
            os.symlink(str(outside), "link", dir_fd=fd)
            child = os.open("d" * 20, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(fd)
        remove_tree(root)
        assert not root.exists() and (outside / "keep").read_text() == "x"
    finally:  # pytest's own clean-up of old temp dirs cannot remove a tree this deep
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=True)


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for member, data in members:
            member.size = len(data) if member.isreg() else 0
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    for key, value in attrs.items():
        setattr(member, key, value)
    return member


def test_a_checkpoint_restores_files_modes_and_links_as_they_were(tmp_path: Path) -> None:
    ws, secret = tmp_path / "ws", tmp_path / "secret.txt"
    (ws / "pkg" / "deep").mkdir(parents=True)
    secret.write_text("TOP SECRET")
    (ws / "pkg" / "a.py").write_text("print(1)\n")
    (ws / "pkg" / "deep" / "run.sh").write_text("#!/bin/sh\n")
    (ws / "pkg" / "deep" / "run.sh").chmod(0o755)
    (ws / "leak").symlink_to(secret)
    data = checkpoint(ws)
    assert checkpoint(ws) == data  # the same workspace, the same bytes: content-addressable
    out = tmp_path / "out"
    out.mkdir()
    uid = os.getuid()
    restore(out, data, uid, uid, max_bytes=1 << 20)
    assert (out / "pkg" / "a.py").read_text() == "print(1)\n"
    assert (out / "pkg" / "deep" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert os.readlink(out / "leak") == str(secret)  # a link again, not the secret's bytes
    assert checkpoint(out) == data


def test_restore_replaces_what_is_in_the_way_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pkg").symlink_to(outside)  # a planted link where the checkpoint has a directory
    data = _archive((_member("pkg", tarfile.DIRTYPE, mode=0o755), b""),
                    (_member("pkg/x.py", mode=0o644), b"x = 1\n"))  # fmt: skip
    restore(ws, data, os.getuid(), os.getgid(), max_bytes=1 << 20)
    assert (ws / "pkg").is_dir() and not (ws / "pkg").is_symlink()
    assert (ws / "pkg" / "x.py").read_text() == "x = 1\n"
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([(_member("../escape.py"), b"x")], "outside the workspace"),
        ([(_member("/etc/cron.d/x"), b"x")], "outside the workspace"),
        ([(_member("a/../../b"), b"x")], "outside the workspace"),
        ([(_member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3), b"")], "neither a file"),
        ([(_member("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), b"")], "neither a file"),
        ([(_member("fifo", tarfile.FIFOTYPE), b"")], "neither a file"),
        ([(_member("big"), b"x" * 2048)], "more than 1024 bytes"),
    ],
)
def test_a_hostile_checkpoint_is_refused_before_it_writes_outside(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str
) -> None:
    ws = tmp_path / "a" / "ws"
    ws.mkdir(parents=True)
    with pytest.raises(BadCheckpoint, match=why):
        restore(ws, _archive(*members), os.getuid(), os.getgid(), max_bytes=1024)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "ws"]


def test_bytes_that_are_not_a_checkpoint_are_refused(tmp_path: Path) -> None:
    for data in (b"", b"not gzip", gzip.compress(b"not a tar" * 100)):
        with pytest.raises(BadCheckpoint, match="not a checkpoint archive"):
            restore(tmp_path, data, os.getuid(), os.getgid(), max_bytes=1024)
