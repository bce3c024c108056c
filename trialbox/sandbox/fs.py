"""Workspace files without trusting the workspace: every open is relative to a directory fd
and refuses symlinks (O_NOFOLLOW), so a link planted by the agent (`tests -> /etc`) can never
make the runner, which is root, read or write outside the tree. Checkpoints (a workspace's
archive, and its restore) are built on these in trialbox.sandbox.checkpoints.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from trialbox.errors import SandboxSetupError

if TYPE_CHECKING:
    from trialbox.models.common import FileContent

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)  # libc, without find_library's ldconfig run


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


def open_dirs(root_fd: int, parts: tuple[str, ...], uid: int, gid: int) -> int:
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
    # Imported here: the checkpoint child (checkpoint_child) imports this module, and starts
    # in 0.05 s without pydantic's models (0.3 s with them).
    from trialbox.models.common import file_bytes, file_mode

    root_fd = os.open(root, DIR_FLAGS)
    try:
        for rel, content in files.items():
            path = PurePosixPath(rel)
            dir_fd = open_dirs(root_fd, path.parts[:-1], uid, gid)
            try:
                replace_file(dir_fd, path.name, file_bytes(content), file_mode(content), uid, gid)
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


def replace_file(dir_fd: int, name: str, data: bytes, mode: int, uid: int, gid: int) -> None:
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


class TreeTooLarge(OSError):
    """A tree past what a copy of a workspace takes: more entries than a workspace holds, more
    data than its size, or more time than the copy's deadline. ENOSPC, as a full tmpfs."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.ENOSPC, why)

    def __str__(self) -> str:
        return str(self.strerror)


class _Names:
    """A walk's names, counted against its bound as each directory is read."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.seen = limit, 0

    def add(self) -> None:
        self.seen += 1
        if self.limit is not None and self.seen > self.limit:
            raise TreeTooLarge(f"more than {self.limit} files and directories")


def walk_nofollow(
    root: Path, prune: Prune | None = None, open_files: bool = True, max_entries: int | None = None
) -> Iterator[Entry]:
    """Every entry under root, without following links. A regular file comes with an open read
    fd (closed once the consumer resumes) unless `open_files` is off. An entry `prune`
    rejects, or a directory deeper than MAX_DEPTH, comes with `left_out` set and is neither
    opened nor entered. More than `max_entries` names in all (each name read counts, left out
    or not) is TreeTooLarge, raised as the name past it is read: a directory of a million
    names costs what the bound's worth does."""
    root_fd = os.open(root, DIR_FLAGS)
    try:
        yield from _walk(root_fd, "", prune, 0, open_files, _Names(max_entries))
    finally:
        os.close(root_fd)


def _walk(
    dir_fd: int, prefix: str, prune: Prune | None, depth: int, open_files: bool, seen: _Names
) -> Iterator[Entry]:
    names = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            seen.add()
            names.append(entry.name)
    names.sort()
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
                yield from _walk(child, f"{rel}/", prune, depth + 1, open_files, seen)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode) and not open_files:
            yield Entry(rel, info, None, None)
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


class _Bounds:
    """What one copy may still take: data (bytes read, holes not) and time."""

    def __init__(self, max_bytes: int, max_s: float | None) -> None:
        self.max_bytes, self.copied, self.max_s = max_bytes, 0, max_s
        self.deadline = None if max_s is None else time.monotonic() + max_s

    def data(self, size: int) -> None:
        self.copied += size
        if self.copied > self.max_bytes:
            raise TreeTooLarge(f"more than {self.max_bytes} bytes of data")

    def clock(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TreeTooLarge(f"took more than {self.max_s:g} s to copy")


def _copy_fd(
    src_fd: int, dir_fd: int, name: str, mode: int, uid: int, gid: int, bounds: _Bounds
) -> None:
    """Stream one file, its holes left holes: the copy takes the pages the original takes
    (memory stays at one chunk, whatever a sparse file claims)."""
    replace_file(dir_fd, name, b"", mode, uid, gid)
    out = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        size = os.fstat(src_fd).st_size
        position = 0
        while position < size:
            try:
                start = os.lseek(src_fd, position, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                break  # a hole to the end
            end = os.lseek(src_fd, start, os.SEEK_HOLE)
            while start < end and (chunk := os.pread(src_fd, min(CHUNK, end - start), start)):
                bounds.data(len(chunk))
                bounds.clock()
                view = memoryview(chunk)
                offset = start
                while view:
                    written = os.pwrite(out, view, offset)
                    view, offset = view[written:], offset + written
                start += len(chunk)
            position = end
        os.ftruncate(out, size)
    finally:
        os.close(out)


def copy_tree(
    src: Path,
    dst: Path,
    prune: Prune,
    uid: int,
    gid: int,
    max_bytes: int,
    max_s: float | None = None,
) -> list[tuple[str, str]]:
    """Copy regular files and directories from src into dst (which must exist), a second name
    of a copied file (a hard link) as a link to its copy, so the copy takes what the original
    takes. Links, fifos, sockets, devices and files over max_bytes are never copied.
    Returns (path, reason) for everything left out.

    What a copy costs is bounded. A few system calls per entry, at any depth: the directories
    on the way down stay open (MAX_DEPTH of them at most), never reopened per file. And a tree
    past a workspace's bounds is TreeTooLarge (an OSError), whichever backend it grew on: more
    than WORKSPACE_INODES names (a tmpfs counts every hard link as an inode too), more than
    `max_bytes` of data, or not copied within `max_s` seconds."""
    bounds = _Bounds(max_bytes, max_s)
    left_out: list[tuple[str, str]] = []
    copies: dict[tuple[int, int], str] = {}  # a linked file's first name, copied
    parents = [os.open(dst, DIR_FLAGS)]  # the open directories down to the entry's parent
    try:
        for rel, info, fd, _, reason in walk_nofollow(src, prune, True, WORKSPACE_INODES):
            bounds.clock()
            is_dir = stat.S_ISDIR(info.st_mode)
            if reason is None and not is_dir and fd is None:
                kind = "symlink" if stat.S_ISLNK(info.st_mode) else "special file"
                reason = f"{kind}: not copied into the grading tree"
            if reason is None and fd is not None and info.st_size > max_bytes:
                reason = f"{info.st_size} bytes: larger than the workspace"
            if reason is not None:
                left_out.append((rel, reason))
                continue
            depth = rel.count("/")  # the walk is depth first: the parent is on the way down
            while len(parents) > depth + 1:
                os.close(parents.pop())
            assert len(parents) == depth + 1, rel
            name = rel.rsplit("/", 1)[-1]
            if is_dir:
                parents.append(open_dirs(parents[-1], (name,), uid, gid))
                continue
            assert fd is not None
            first = copies.get((info.st_dev, info.st_ino))
            if first is not None:
                _link_copy(parents[0], first, parents[-1], name)
                continue
            mode = 0o755 if info.st_mode & 0o111 else 0o644
            _copy_fd(fd, parents[-1], name, mode, uid, gid, bounds)
            if info.st_nlink > 1:
                copies[(info.st_dev, info.st_ino)] = rel
    finally:
        for dir_fd in parents:
            os.close(dir_fd)
    return left_out


PATH_STEP = 4000  # bytes of a relative path resolved in one open: less than PATH_MAX


def _link_copy(dst_fd: int, first: str, parent: int, name: str) -> None:
    """Link `first` (a path under dst_fd) as `name` in `parent`. The kernel resolves the way
    to it, PATH_STEP bytes per open, so a link costs a few calls at any depth. The tree is the
    copy's own, made of directories and files while nothing else writes in it."""
    *way, last = first.split("/")
    source = os.dup(dst_fd)
    try:
        while way:
            size, count = 0, 0
            while count < len(way) and size + len(os.fsencode(way[count])) < PATH_STEP:
                size += len(os.fsencode(way[count])) + 1
                count += 1
            step = os.open("/".join(way[:count]), DIR_FLAGS, dir_fd=source)
            os.close(source)
            source, way = step, way[count:]
        os.link(last, name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(source)


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
