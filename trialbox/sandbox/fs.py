"""Workspace files without trusting the workspace: every open is relative to a directory fd
and refuses symlinks (O_NOFOLLOW), so a link planted by the agent (`tests -> /etc`) can never
make the runner, which is root, read or write outside the tree.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, NamedTuple

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


def walk_nofollow(
    root: Path, prune: Prune | None = None, open_files: bool = True
) -> Iterator[Entry]:
    """Every entry under root, without following links. A regular file comes with an open read
    fd (closed once the consumer resumes) unless `open_files` is off. An entry `prune`
    rejects, or a directory deeper than MAX_DEPTH, comes with `left_out` set and is neither
    opened nor entered."""
    root_fd = os.open(root, DIR_FLAGS)
    try:
        yield from _walk(root_fd, "", prune, 0, open_files)
    finally:
        os.close(root_fd)


def _walk(
    dir_fd: int, prefix: str, prune: Prune | None, depth: int, open_files: bool
) -> Iterator[Entry]:
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
                yield from _walk(child, f"{rel}/", prune, depth + 1, open_files)
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


def _copy_fd(src_fd: int, dir_fd: int, name: str, mode: int, uid: int, gid: int) -> None:
    """Stream one file, its holes left holes: the copy takes the pages the original takes
    (memory stays at one chunk, whatever a sparse file claims)."""
    _replace_file(dir_fd, name, b"", mode, uid, gid)
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
    src: Path, dst: Path, prune: Prune, uid: int, gid: int, max_file_bytes: int
) -> list[tuple[str, str]]:
    """Copy regular files and directories from src into dst (which must exist), a second name
    of a copied file (a hard link) as a link to its copy, so the copy takes what the original
    takes. Links, fifos, sockets, devices and files over max_file_bytes are never copied.
    Returns (path, reason) for everything left out."""
    left_out: list[tuple[str, str]] = []
    copies: dict[tuple[int, int], tuple[str, ...]] = {}
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
            copy = copies.get((info.st_dev, info.st_ino))
            parent = _open_dirs(dst_fd, parts[:-1], uid, gid)
            try:
                if copy is not None:
                    _link_copy(dst_fd, copy, parent, parts[-1])
                    continue
                mode = 0o755 if info.st_mode & 0o111 else 0o644
                _copy_fd(fd, parent, parts[-1], mode, uid, gid)
                if info.st_nlink > 1:
                    copies[(info.st_dev, info.st_ino)] = parts
            finally:
                os.close(parent)
    finally:
        os.close(dst_fd)
    return left_out


def _link_copy(dst_fd: int, copy: tuple[str, ...], parent: int, name: str) -> None:
    source = _open_dirs(dst_fd, copy[:-1], 0, 0)  # there already: nothing is created
    try:
        os.link(copy[-1], name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(source)


class BadCheckpoint(ValueError):
    """A checkpoint that cannot be restored as it is: the message says why."""


class CheckpointTooLarge(BadCheckpoint):
    """A workspace too large (or too deep) to checkpoint whole, or a checkpoint larger than
    the workspace it is restored into."""


PAGE = 4096  # a tmpfs file takes whole pages: a 1-byte file costs 4 KiB of the workspace
SHORT_SYMLINK = 128  # tmpfs keeps a shorter link target in the inode; a longer one takes a page
MAX_NAMES = 4 * WORKSPACE_INODES  # hard links: names beyond inodes, each a tar member
BLOCK = 1 << 20  # a checkpoint is gzip members of this much tar each, stored or compressed
PROBE = 64 << 10  # a block's first bytes, compressed to see whether the rest is worth it


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


class Budget:
    """What restoring a workspace costs in the tmpfs it goes to: pages of file content and
    inodes, counted the way tmpfs counts them (a hard link is a name, not a file; a sparse
    file counts in full, as a restore writes it). The checkpoint and the restore share it,
    so that what one stores the other fits."""

    def __init__(self, max_bytes: int | None, max_inodes: int) -> None:
        self.max_bytes, self.max_inodes = max_bytes, max_inodes
        self.used = 0
        self.inodes = 1  # the root
        self.names = 0

    def add(self, name: str, size: int = 0, inode: bool = True) -> None:
        self.names += 1
        self.inodes += inode
        self.used += _pages(size)
        if self.max_bytes is not None and self.used > self.max_bytes:
            raise CheckpointTooLarge(
                f"the workspace holds more than {self.max_bytes} bytes of files, counted as a "
                f"restore writes them (in {PAGE}-byte pages, a sparse file at its full size)"
            )
        if self.inodes > self.max_inodes:
            raise CheckpointTooLarge(f"more than {self.max_inodes} files and directories")
        if self.names > MAX_NAMES:
            raise CheckpointTooLarge(f"more than {MAX_NAMES} names (hard links included)")


def checkpoint(
    root: Path, max_bytes: int | None = None, max_inodes: int = WORKSPACE_INODES
) -> bytes:
    """A tar.gz of the workspace. Links are stored as links, never followed; a second name of
    a file (a hard link) as a hard link to its first name. FIFOs, sockets and devices are not
    state (nothing runs between calls) and are left out. A workspace whose restore would not
    fit `max_bytes` and `max_inodes` (see Budget), or a directory deeper than MAX_DEPTH,
    raises CheckpointTooLarge: a checkpoint is the whole workspace or none."""
    budget = Budget(max_bytes, max_inodes)
    first_names: dict[tuple[int, int], str] = {}
    packed = _GzipBlocks()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, info, fd, link, left_out in walk_nofollow(root):
            if left_out is not None:  # restored without it, the workspace would not be this one
                raise CheckpointTooLarge(f"{rel}: {left_out}, beyond what a checkpoint keeps")
            member = tarfile.TarInfo(rel)
            member.mode = info.st_mode & 0o777
            member.mtime = int(info.st_mtime)
            if stat.S_ISDIR(info.st_mode):
                budget.add(rel)
                member.type = tarfile.DIRTYPE
                tar.addfile(member)
            elif fd is not None:
                first = first_names.get((info.st_dev, info.st_ino))
                if first is not None:
                    budget.add(rel, inode=False)
                    member.type = tarfile.LNKTYPE
                    member.linkname = first
                    tar.addfile(member)
                    continue
                if info.st_nlink > 1:
                    first_names[(info.st_dev, info.st_ino)] = rel
                budget.add(rel, info.st_size)
                member.size = info.st_size
                with os.fdopen(os.dup(fd), "rb") as stream:
                    tar.addfile(member, stream)
            elif link is not None:
                budget.add(rel, PAGE if len(os.fsencode(link)) >= SHORT_SYMLINK else 0)
                member.type = tarfile.SYMTYPE
                member.linkname = link
                tar.addfile(member)
    return packed.getvalue()


class _GzipBlocks(io.RawIOBase):
    """A write-only stream that gzips what it is given as one gzip member per BLOCK (gzip
    readers take concatenated members). A block whose PROBE does not compress is stored
    (level 0): zlib spends as long on random bytes as on text, for nothing. The worker's
    CPU per checkpoint is then about 0.15 s per 60 MiB of random bytes, 0.9 s of text
    (gzip level 9 over the whole: 1.8 s and 2.5 s). The same input, the same bytes."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._out = io.BytesIO()
        self._written = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._pending += data
        self._written += len(data)
        while len(self._pending) >= BLOCK:
            self._pack(bytes(self._pending[:BLOCK]))
            del self._pending[:BLOCK]
        return len(data)

    def _pack(self, block: bytes) -> None:
        probe = block[:PROBE]
        worth = len(zlib.compress(probe, 1)) < len(probe) * 0.9
        # mtime=0: the gzip header does not make two identical workspaces differ.
        self._out.write(gzip.compress(block, 1 if worth else 0, mtime=0))

    def getvalue(self) -> bytes:
        if self._pending or not self._out.tell():
            self._pack(bytes(self._pending))
            self._pending.clear()
        return self._out.getvalue()


def restore(
    root: Path,
    data: bytes,
    uid: int,
    gid: int,
    max_bytes: int,
    max_inodes: int = WORKSPACE_INODES,
) -> None:
    """Unpack a checkpoint (`checkpoint`'s tar.gz) under `root`, owned by uid:gid: directories,
    regular files (their mode bits at most 0o777), links, created as links and never
    followed, and hard links to a file restored before them, each with its saved mtime.
    Anything else, a name outside the tree, or more than a workspace of `max_bytes` and
    `max_inodes` holds (see Budget) raises BadCheckpoint before that entry is written."""
    budget = Budget(max_bytes, max_inodes)
    dirs: list[tuple[tuple[str, ...], float]] = []
    root_fd = os.open(root, DIR_FLAGS)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                parts = _member_parts(member.name)
                if member.isreg():
                    budget.add(member.name, member.size)
                elif member.issym():
                    long = len(os.fsencode(member.linkname)) >= SHORT_SYMLINK
                    budget.add(member.name, PAGE if long else 0)
                else:
                    budget.add(member.name, inode=not member.islnk())
                _restore_member(tar, member, root_fd, parts, uid, gid)
                if member.isdir():
                    dirs.append((parts, member.mtime))
            # Their entries are written: the directories' times last, deepest first.
            for parts, mtime in reversed(dirs):
                fd = _open_dirs(root_fd, parts, uid, gid)
                try:
                    os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)
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
    if not (member.isreg() or member.issym() or member.islnk()):
        raise BadCheckpoint(f"entry {member.name!r} is neither a file, a directory nor a link")
    target = _link_target(root_fd, member) if member.islnk() else None
    parent = _open_dirs(root_fd, parts[:-1], uid, gid)
    try:
        if member.isreg():
            stream = tar.extractfile(member)
            assert stream is not None
            _replace_file(parent, parts[-1], b"", mode, uid, gid)
            _copy_stream(stream, parent, parts[-1])
            _set_mtime(parent, parts[-1], member.mtime)
            return
        _replace_file(parent, parts[-1], b"", 0o600, uid, gid)  # clears the way
        os.unlink(parts[-1], dir_fd=parent)
        if target is not None:
            target_dir, target_name = target
            os.link(target_name, parts[-1], src_dir_fd=target_dir, dst_dir_fd=parent,
                    follow_symlinks=False)  # fmt: skip
            return
        os.symlink(member.linkname, parts[-1], dir_fd=parent)
        os.chown(parts[-1], uid, gid, dir_fd=parent, follow_symlinks=False)
        _set_mtime(parent, parts[-1], member.mtime)
    finally:
        os.close(parent)
        if target is not None:
            os.close(target[0])


def _set_mtime(dir_fd: int, name: str, mtime: float) -> None:
    """The time the checkpoint saved: restored, the workspace checkpoints to the same bytes
    (and so is not stored again)."""
    os.utime(name, (mtime, mtime), dir_fd=dir_fd, follow_symlinks=False)


def _link_target(root_fd: int, member: tarfile.TarInfo) -> tuple[int, str]:
    """A hard link's target: a regular file restored already, reached without following any
    link (its directory's fd, and its name)."""
    parts = _member_parts(member.linkname)
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        os.close(fd)
        raise BadCheckpoint(f"hard link {member.name!r}: no file {member.linkname!r}") from exc
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadCheckpoint(f"hard link {member.name!r}: {member.linkname!r} is not a file")
    return fd, parts[-1]


def _copy_stream(stream: IO[bytes], dir_fd: int, name: str) -> None:
    """A member's bytes into a file created empty, one chunk in memory at a time."""
    out = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        while chunk := stream.read(CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
    finally:
        os.close(out)


SETTLE_NS = 200_000_000  # far more than a clock tick (timestamps are tick-coarse, 1-10 ms)


def fingerprint(root: Path) -> str | None:
    """What the tree is, from its entries' metadata alone: every name, inode, size, mode and
    ctime. A change to any file or directory sets its ctime to now, which no process can set
    back, so an unchanged fingerprint means an unchanged tree, and its checkpoint can be
    reused rather than built again (nothing may run in the tree meanwhile). None while an
    entry changed within SETTLE_NS: a later change in the same clock tick would leave the
    same ctime, and could not be told apart."""
    digest = hashlib.sha256()
    settled_before = time.time_ns() - SETTLE_NS
    root_info = os.lstat(root)
    newest = root_info.st_ctime_ns
    digest.update(f"{root_info.st_mode} {root_info.st_ctime_ns}\n".encode())
    for rel, info, _, _, left_out in walk_nofollow(root, open_files=False):
        fields = (info.st_ino, info.st_mode, info.st_nlink, info.st_size, info.st_mtime_ns,
                  info.st_ctime_ns, left_out)  # fmt: skip
        digest.update(os.fsencode(rel) + b"\0" + repr(fields).encode() + b"\n")
        newest = max(newest, info.st_ctime_ns)
    return digest.hexdigest() if newest < settled_before else None


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
