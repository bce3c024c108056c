"""Workspace files never followed through symlinks: write_files, copy_tree, checkpoint and
restore."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from trialbox.models import EncodedFile
from trialbox.sandbox.checkpoints import (
    PAGE,
    SETTLE_NS,
    BadCheckpoint,
    CheckpointTooLarge,
    checkpoint,
    fingerprint,
    restore,
)
from trialbox.sandbox.fs import copy_tree, remove_tree, write_files

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
        ([(_member("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), b"")], "outside"),
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


# --- what a checkpoint stores, a restore fits (issue 22) ---------------------------------


def test_hard_links_are_stored_and_restored_as_links(tmp_path: Path) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "d").mkdir(parents=True)
    out.mkdir()
    (ws / "one").write_text("x")
    for i in range(50):
        os.link(ws / "one", ws / "d" / str(i))
    data = checkpoint(ws, max_bytes=PAGE * 2)  # 51 names of one 1-byte file: one page
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        kinds = {m.name: (m.type, m.linkname) for m in tar.getmembers()}
    assert kinds["d/0"] == (tarfile.REGTYPE, "")  # the first name walked ("d" < "one")
    assert kinds["d/7"] == kinds["one"] == (tarfile.LNKTYPE, "d/0")
    restore(out, data, UID, GID, max_bytes=PAGE * 2)
    assert (out / "one").stat().st_nlink == 51
    assert (out / "d" / "7").stat().st_ino == (out / "one").stat().st_ino
    assert checkpoint(out) == data


def test_a_checkpoint_counts_what_a_restore_takes_in_pages_and_inodes(tmp_path: Path) -> None:
    """100 one-byte files are 100 bytes, but 100 pages of a tmpfs and 100 of its inodes."""
    for i in range(100):
        (tmp_path / f"f{i}").write_text("x")
    assert checkpoint(tmp_path, max_bytes=100 * PAGE, max_inodes=101)
    with pytest.raises(CheckpointTooLarge, match=f"more than {100 * PAGE - 1} bytes"):
        checkpoint(tmp_path, max_bytes=100 * PAGE - 1)
    with pytest.raises(CheckpointTooLarge, match="more than 100 files and directories"):
        checkpoint(tmp_path, max_bytes=None, max_inodes=100)


def test_restore_refuses_what_the_workspace_could_not_hold(tmp_path: Path) -> None:
    data = _archive(*[(_member(f"f{i}"), b"x") for i in range(10)])
    with pytest.raises(CheckpointTooLarge, match="more than 36863 bytes"):
        restore(tmp_path, data, UID, GID, max_bytes=9 * PAGE - 1)
    with pytest.raises(CheckpointTooLarge, match="more than 5 files"):
        restore(tmp_path, data, UID, GID, max_bytes=1 << 20, max_inodes=5)


@pytest.mark.parametrize(
    "linkname", ["missing", "../../etc/passwd", "dir", "sym"], ids=["missing", "out", "dir", "sym"]
)
def test_a_hard_link_to_anything_but_a_restored_file_is_refused(
    tmp_path: Path, linkname: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    data = _archive((_member("dir", tarfile.DIRTYPE, mode=0o755), b""),
                    (_member("sym", tarfile.SYMTYPE, linkname="/etc/passwd"), b""),
                    (_member("hard", tarfile.LNKTYPE, linkname=linkname), b""))  # fmt: skip
    with pytest.raises(BadCheckpoint, match=r"hard link 'hard'|'\.\./\.\./etc/passwd' is outside"):
        restore(ws, data, UID, GID, max_bytes=1 << 20)
    assert not (ws / "hard").exists() and os.stat("/etc/passwd").st_nlink == 1


def test_copy_tree_keeps_hard_links_and_holes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "one").write_text("x")
    os.link(src / "one", src / "two")
    with open(src / "sparse", "wb") as sparse:
        sparse.truncate(64 << 20)
        sparse.seek(32 << 20)
        sparse.write(b"middle")
    assert copy_tree(src, dst, no_skip, UID, GID, 1 << 30) == []
    assert (dst / "two").stat().st_ino == (dst / "one").stat().st_ino
    copied = (dst / "sparse").stat()
    assert copied.st_size == 64 << 20 and copied.st_blocks * 512 <= 1 << 20
    with open(dst / "sparse", "rb") as f:
        f.seek((32 << 20) - 1)
        assert f.read(8) == b"\0middle\0"


def test_a_fingerprint_changes_with_any_change_and_only_then(tmp_path: Path) -> None:
    settle = SETTLE_NS / 1e9 + 0.05
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("a")
    assert fingerprint(tmp_path) is None  # just changed: a change in this tick would not show
    time.sleep(settle)
    before = fingerprint(tmp_path)
    assert before is not None and fingerprint(tmp_path) == before
    stamp = (tmp_path / "d" / "f").stat()
    (tmp_path / "d" / "f").write_text("b")  # same size, its mtime put back: the ctime moved
    os.utime(tmp_path / "d" / "f", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    time.sleep(settle)
    changed = fingerprint(tmp_path)
    assert changed not in (None, before)
    os.link(tmp_path / "d" / "f", tmp_path / "g")
    time.sleep(settle)
    assert fingerprint(tmp_path) not in (None, changed)


def test_a_checkpoint_costs_the_worker_far_less_cpu_than_gzip_nine(tmp_path: Path) -> None:
    """Random bytes are stored, not squeezed for nothing; text at a cheap level. Measured in
    the same process against zlib level 9 over the same bytes (what the worker spent before)."""
    random_bytes = os.urandom(6 << 20)
    text = b"".join(b"line %d of some source text, words words\n" % i for i in range(150_000))
    (tmp_path / "noise").write_bytes(random_bytes)
    (tmp_path / "text").write_bytes(text)
    started = time.process_time()
    data = checkpoint(tmp_path)
    spent = time.process_time() - started
    started = time.process_time()
    for chunk in (random_bytes, text):
        zlib.compress(chunk, 9)
    level_nine = time.process_time() - started
    assert spent < level_nine / 2, (spent, level_nine)
    assert len(data) < len(random_bytes) + len(text) // 4  # the text is still compressed
    assert gzip.decompress(data).count(b"some source text") == 150_000


def test_a_restored_workspace_checkpoints_to_the_same_bytes(tmp_path: Path) -> None:
    """Restored a minute later, the workspace is the one saved, times included: its next
    checkpoint is the same archive, not one more to store (and count against the quota)."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "pkg" / "deep").mkdir(parents=True)
    out.mkdir()
    (ws / "pkg" / "deep" / "a.py").write_text("x = 1\n")
    (ws / "link").symlink_to("pkg/deep/a.py")
    for path in (ws / "pkg" / "deep" / "a.py", ws / "pkg" / "deep", ws / "pkg"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    os.utime(ws / "link", (1_000_000_000, 1_000_000_000), follow_symlinks=False)
    data = checkpoint(ws)
    restore(out, data, UID, GID, max_bytes=1 << 20)
    assert (out / "pkg").stat().st_mtime == 1_000_000_000
    assert (out / "link").lstat().st_mtime == 1_000_000_000
    assert checkpoint(out) == data
