"""Workspace files without trusting the workspace: every open is relative to a directory fd
and refuses symlinks (O_NOFOLLOW), so a link planted by the agent (`tests -> /etc`) can never
make the runner, which is root, read or write outside the tree.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import io
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from trialbox.errors import SandboxSetupError
from trialbox.models.common import FileContent, file_bytes, file_mode

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


WORKSPACE_INODES = 65536


def mount_tmpfs(
    path: Path, size_mb: int, uid: int, gid: int, mode: int, inodes: int = WORKSPACE_INODES
) -> None:
    """A size-capped tmpfs (ENOSPC when full), mounted on the host so it outlives the sandbox."""
    options = f"size={size_mb}m,uid={uid},gid={gid},mode={mode:o},nr_inodes={inodes}"
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV (not MS_NOEXEC: agents run their own scripts)
    if _libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", flags, options.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxSetupError(f"cannot mount a tmpfs on {path}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    while os.path.ismount(path):
        if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise SandboxSetupError(f"cannot unmount {path}: {os.strerror(err)}")


def _open_dirs(root_fd: int, parts: tuple[str, ...], uid: int, gid: int) -> int:
    """Open (creating as needed) the directory chain under root_fd. Nothing is followed: a
    link or file in the chain is replaced by a directory."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            info = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            os.unlink(part, dir_fd=fd)  # a file or link where a directory must go: it loses
            info = None
        if info is None:
            os.mkdir(part, 0o755, dir_fd=fd)
            os.chown(part, uid, gid, dir_fd=fd, follow_symlinks=False)
        try:
            next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = next_fd
    return fd


def write_files(root: Path, files: dict[str, FileContent], uid: int, gid: int) -> None:
    """Write files under `root`, owned by uid:gid. Each file replaces whatever is at its path
    or in the way of its directories (links included, never followed)."""
    root_fd = os.open(root, DIR_FLAGS)
    try:
        for rel, content in files.items():
            path = PurePosixPath(rel)
            dir_fd = _open_dirs(root_fd, path.parts[:-1], uid, gid)
            try:
                _replace_file(dir_fd, path.name, file_bytes(content), file_mode(content), uid, gid)
            finally:
                os.close(dir_fd)
    finally:
        os.close(root_fd)


class NotAFile(ValueError):
    """A path that names something other than a regular file, or one too large to read."""


def read_file(root: Path, rel: str, max_bytes: int) -> bytes:
    """A regular file's bytes under `root`; no component is followed through a link
    (OSError ELOOP/ENOTDIR/ENOENT when one is in the way)."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or "\0" in rel:
        raise NotAFile(f"{rel!r}: not a path inside the workspace")
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], READ_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(f"{rel}: not a regular file")
        if info.st_size > max_bytes:
            raise NotAFile(f"{rel}: {info.st_size} bytes, more than the {max_bytes} read at once")
        return stream.read(max_bytes + 1)[:max_bytes]


def _replace_file(dir_fd: int, name: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        # A later layer wins every collision: a file, link or whole directory in the way goes
        # (links are removed, never followed).
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    fd = os.open(name, CREATE_FLAGS, mode, dir_fd=dir_fd)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


MAX_DEPTH = 64  # deeper directories are left out: bounded recursion and open fds
CHUNK = 1 << 20


class Entry(NamedTuple):
    path: str  # relative to the walked root
    info: os.stat_result  # lstat
    fd: int | None  # an open read fd for a regular file
    link: str | None  # the target of a symlink (read, never followed)
    left_out: str | None = None  # why the walk did not enter or open it


Prune = Callable[[str, bool], str | None]  # (relative path, is_dir) -> reason to leave it out


def walk_nofollow(root: Path, prune: Prune | None = None) -> Iterator[Entry]:
    """Every entry under root, without following links. A regular file comes with an open read
    fd (closed once the consumer resumes). An entry `prune` rejects, or a directory deeper
    than MAX_DEPTH, comes with `left_out` set and is neither opened nor entered."""
    root_fd = os.open(root, DIR_FLAGS)
    try:
        yield from _walk(root_fd, "", prune, 0)
    finally:
        os.close(root_fd)


def _walk(dir_fd: int, prefix: str, prune: Prune | None, depth: int) -> Iterator[Entry]:
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        rel = f"{prefix}{name}"
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        is_dir = stat.S_ISDIR(info.st_mode)
        reason = prune(rel, is_dir) if prune else None
        if reason is None and is_dir and depth >= MAX_DEPTH:
            reason = f"deeper than {MAX_DEPTH} directory levels"
        if reason is not None:
            yield Entry(rel, info, None, None, reason)
        elif is_dir:
            yield Entry(rel, info, None, None)
            child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            try:
                yield from _walk(child, f"{rel}/", prune, depth + 1)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):  # still the file we looked at
                    yield Entry(rel, info, fd, None)
            finally:
                os.close(fd)
        elif stat.S_ISLNK(info.st_mode):
            yield Entry(rel, info, None, os.readlink(name, dir_fd=dir_fd))
        else:
            yield Entry(rel, info, None, None)


def _copy_fd(src_fd: int, dir_fd: int, name: str, mode: int, uid: int, gid: int) -> None:
    """Stream one file (memory stays at one chunk, whatever a sparse file claims)."""
    _replace_file(dir_fd, name, b"", mode, uid, gid)
    out = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        while chunk := os.read(src_fd, CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
    finally:
        os.close(out)


def copy_tree(
    src: Path, dst: Path, prune: Prune, uid: int, gid: int, max_file_bytes: int
) -> list[tuple[str, str]]:
    """Copy regular files and directories from src into dst (which must exist). Links, fifos,
    sockets, devices and files over max_file_bytes are never copied. Returns (path, reason)
    for everything left out."""
    left_out: list[tuple[str, str]] = []
    dst_fd = os.open(dst, DIR_FLAGS)
    try:
        for rel, info, fd, _, reason in walk_nofollow(src, prune):
            is_dir = stat.S_ISDIR(info.st_mode)
            if reason is None and not is_dir and fd is None:
                kind = "symlink" if stat.S_ISLNK(info.st_mode) else "special file"
                reason = f"{kind}: not copied into the grading tree"
            if reason is None and fd is not None and info.st_size > max_file_bytes:
                reason = f"{info.st_size} bytes: larger than the workspace"
            if reason is not None:
                left_out.append((rel, reason))
                continue
            parts = PurePosixPath(rel).parts
            if is_dir:
                os.close(_open_dirs(dst_fd, parts, uid, gid))
                continue
            assert fd is not None
            parent = _open_dirs(dst_fd, parts[:-1], uid, gid)
            try:
                mode = 0o755 if info.st_mode & 0o111 else 0o644
                _copy_fd(fd, parent, parts[-1], mode, uid, gid)
            finally:
                os.close(parent)
    finally:
        os.close(dst_fd)
    return left_out


class BadCheckpoint(ValueError):
    """A checkpoint that cannot be restored as it is: the message says why."""


class CheckpointTooLarge(BadCheckpoint):
    """A workspace too large (or too deep) to checkpoint whole, or a checkpoint larger than
    the workspace it is restored into."""


def checkpoint(root: Path, max_bytes: int | None = None) -> bytes:
    """A tar.gz of the workspace. Links are stored as links, never followed. More than
    `max_bytes` of files (apparent sizes: a sparse file counts in full, as a restore would
    write it), or a directory deeper than MAX_DEPTH, raises CheckpointTooLarge: a checkpoint
    is the whole workspace or none."""
    total = 0
    buffer = io.BytesIO()
    # mtime=0: the gzip header does not make two identical workspaces differ.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, info, fd, link, left_out in walk_nofollow(root):
            if left_out is not None:  # restored without it, the workspace would not be this one
                raise CheckpointTooLarge(f"{rel}: {left_out}, beyond what a checkpoint keeps")
            member = tarfile.TarInfo(rel)
            member.mode = info.st_mode & 0o777
            member.mtime = int(info.st_mtime)
            if stat.S_ISDIR(info.st_mode):
                member.type = tarfile.DIRTYPE
                tar.addfile(member)
            elif fd is not None:
                member.size = info.st_size
                total += info.st_size
                if max_bytes is not None and total > max_bytes:
                    raise CheckpointTooLarge(
                        f"the workspace holds more than {max_bytes} bytes of files (a sparse "
                        "file counts at its full size)"
                    )
                with os.fdopen(os.dup(fd), "rb") as stream:
                    tar.addfile(member, stream)
            elif link is not None:
                member.type = tarfile.SYMTYPE
                member.linkname = link
                tar.addfile(member)
    return buffer.getvalue()


def restore(root: Path, data: bytes, uid: int, gid: int, max_bytes: int) -> None:
    """Unpack a checkpoint (`checkpoint`'s tar.gz) under `root`, owned by uid:gid: directories,
    regular files (their mode bits at most 0o777) and links, created as links and never
    followed. Anything else, a name outside the tree, more than `max_bytes` of file content
    or more entries than a workspace holds raises BadCheckpoint before that entry is written."""
    total = 0
    root_fd = os.open(root, DIR_FLAGS)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for count, member in enumerate(tar, 1):
                if count > WORKSPACE_INODES:
                    raise BadCheckpoint(f"more than {WORKSPACE_INODES} entries")
                parts = _member_parts(member.name)
                total += member.size if member.isreg() else 0
                if total > max_bytes:
                    raise CheckpointTooLarge(f"more than {max_bytes} bytes of files")
                _restore_member(tar, member, root_fd, parts, uid, gid)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BadCheckpoint(f"not a checkpoint archive ({type(exc).__name__}: {exc})") from exc
    finally:
        os.close(root_fd)


def _member_parts(name: str) -> tuple[str, ...]:
    path = PurePosixPath(name)
    parts = tuple(p for p in path.parts if p != ".")
    if not parts or path.is_absolute() or ".." in parts or "\0" in name:
        raise BadCheckpoint(f"entry {name!r} is outside the workspace")
    return parts


def _restore_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    root_fd: int,
    parts: tuple[str, ...],
    uid: int,
    gid: int,
) -> None:
    mode = member.mode & 0o777
    if member.isdir():
        fd = _open_dirs(root_fd, parts, uid, gid)
        try:
            os.fchmod(fd, mode | 0o700)  # its owner can always enter and clean it
        finally:
            os.close(fd)
        return
    if not (member.isreg() or member.issym()):
        raise BadCheckpoint(f"entry {member.name!r} is neither a file, a directory nor a link")
    parent = _open_dirs(root_fd, parts[:-1], uid, gid)
    try:
        if member.isreg():
            stream = tar.extractfile(member)
            assert stream is not None
            _replace_file(parent, parts[-1], stream.read(), mode, uid, gid)
            return
        _replace_file(parent, parts[-1], b"", 0o600, uid, gid)  # clears the way
        os.unlink(parts[-1], dir_fd=parent)
        os.symlink(member.linkname, parts[-1], dir_fd=parent)
        os.chown(parts[-1], uid, gid, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it, at any depth, never following a link. A job can
    build a tree deeper than Python's recursion limit or PATH_MAX, so this walks it with one
    open directory at a time and a stack of names; nothing may run in the tree meanwhile."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    names: list[str] = []  # the way down from `path`
    fd = os.open(path, DIR_FLAGS)
    try:
        while True:
            subdir = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdir = subdir or entry.name
                    else:
                        os.unlink(entry.name, dir_fd=fd)
            if subdir is not None:
                child = os.open(subdir, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(subdir)
                continue
            if not names:
                break
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)
