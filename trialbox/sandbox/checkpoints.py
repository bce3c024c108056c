"""A session's or a job's workspace saved whole and restored whole: `checkpoint` archives the
tree (never following a link), `restore` unpacks an archive into a workspace, and both count
what the restore costs the tmpfs it goes to (Budget), so that what a checkpoint stores a
restore fits. `fingerprint` tells an unchanged tree without reading it. Every file access is
the directory-fd, no-follow kind of trialbox.sandbox.fs.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import stat
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

from trialbox.sandbox.fs import (
    CHUNK,
    DIR_FLAGS,
    MAX_DEPTH,
    WORKSPACE_INODES,
    open_dirs,
    replace_file,
    walk_nofollow,
)


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
    """`write_checkpoint`'s archive, in memory."""
    out = io.BytesIO()
    write_checkpoint(root, out, max_bytes, max_inodes)
    return out.getvalue()


def write_checkpoint(
    root: Path, out: IO[bytes], max_bytes: int | None = None, max_inodes: int = WORKSPACE_INODES
) -> None:
    """A tar.gz of the workspace, written to `out` a block at a time. Links are stored as
    links, never followed; a second name of a file (a hard link) as a hard link to its first
    name. FIFOs, sockets and devices are not state (nothing runs between calls) and are left
    out. A workspace whose restore would not fit `max_bytes` and `max_inodes` (see Budget),
    or a directory deeper than MAX_DEPTH, raises CheckpointTooLarge: a checkpoint is the
    whole workspace or none (what `out` got by then is not one)."""
    budget = Budget(max_bytes, max_inodes)
    first_names: dict[tuple[int, int], str] = {}
    packed = _GzipBlocks(out)
    # GNU's long names, not PAX headers: a restore parses a PAX header with a regex over its
    # whole text (a 16 KiB path: 0.4 ms a member, 8 s for 20,000 of them).
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.GNU_FORMAT) as tar:
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
    packed.finish()


class _GzipBlocks(io.RawIOBase):
    """A write-only stream that gzips what it is given as one gzip member per BLOCK (gzip
    readers take concatenated members). A block whose PROBE does not compress is stored
    (level 0): zlib spends as long on random bytes as on text, for nothing. The CPU of a
    checkpoint is then about 0.15 s per 60 MiB of random bytes, 0.9 s of text
    (gzip level 9 over the whole: 1.8 s and 2.5 s). The same input, the same bytes."""

    def __init__(self, out: IO[bytes]) -> None:
        self._pending = bytearray()
        self._out = out
        self._written = 0
        self._blocks = 0

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
        self._blocks += 1

    def finish(self) -> None:
        """The last, partial block (an empty archive is one empty member)."""
        if self._pending or not self._blocks:
            self._pack(bytes(self._pending))
            self._pending.clear()


def restore(
    root: Path,
    data: bytes | IO[bytes],
    uid: int,
    gid: int,
    max_bytes: int,
    max_inodes: int = WORKSPACE_INODES,
    compressed: bool = True,
) -> None:
    """Unpack a checkpoint (`checkpoint`'s tar.gz, or a plain tar when not `compressed`) under
    `root`, owned by uid:gid: directories, regular files (their mode bits at most 0o777), links,
    created as links and never followed, and hard links to a file restored before them, each
    with its saved mtime. Read as a stream, one member in memory at a time (a TarFile keeps
    every member it read: hundreds of MiB for a tree of many long names). Anything else, a name
    outside the tree, or more than a workspace of `max_bytes` and `max_inodes` holds (see
    Budget) raises BadCheckpoint before that entry is written."""
    budget = Budget(max_bytes, max_inodes)
    dirs: list[tuple[tuple[str, ...], float]] = []
    stream: IO[bytes] = io.BytesIO(data) if isinstance(data, bytes) else data
    root_fd = os.open(root, DIR_FLAGS)
    chain = _DirChain(root_fd, uid, gid)
    try:
        with contextlib.ExitStack() as stack:
            if compressed:  # concatenated gzip members (_GzipBlocks): GzipFile reads them all
                stream = stack.enter_context(gzip.GzipFile(fileobj=stream, mode="rb"))  # type: ignore[arg-type]
            tar = stack.enter_context(tarfile.open(fileobj=stream, mode="r|"))
            while (member := tar.next()) is not None:
                tar.members.clear()  # type: ignore[attr-defined]
                parts = _member_parts(member.name)
                if member.isreg():
                    budget.add(member.name, member.size)
                elif member.issym():
                    long = len(os.fsencode(member.linkname)) >= SHORT_SYMLINK
                    budget.add(member.name, PAGE if long else 0)
                else:
                    budget.add(member.name, inode=not member.islnk())
                _restore_member(tar, member, chain, parts, uid, gid)
                if member.isdir():
                    dirs.append((parts, member.mtime))
        # Their entries are written: the directories' times last, deepest first.
        for parts, mtime in reversed(dirs):
            os.utime(chain.open(parts), (mtime, mtime))
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BadCheckpoint(f"not a checkpoint archive ({type(exc).__name__}: {exc})") from exc
    finally:
        chain.close()
        os.close(root_fd)


class _DirChain:
    """The directories of the last path opened, each an open fd: the next entry of a walk
    mostly shares its directories, so only the parts that differ are opened (open_dirs: created
    as needed, nothing followed). A restore then costs a few system calls per entry at any
    depth, not one per level (issue 22: 20,000 files 63 levels deep took 12.6 s of CPU)."""

    def __init__(self, root_fd: int, uid: int, gid: int) -> None:
        self.root_fd, self.uid, self.gid = root_fd, uid, gid
        self.names: list[str] = []
        self.fds: list[int] = []

    def open(self, parts: tuple[str, ...]) -> int:
        """The directory at `parts`, an fd this chain owns (valid until the next call)."""
        if len(parts) > MAX_DEPTH:
            raise CheckpointTooLarge(f"{'/'.join(parts)[:200]}: deeper than {MAX_DEPTH} levels")
        common = 0
        while common < min(len(parts), len(self.names)) and parts[common] == self.names[common]:
            common += 1
        self.forget(common)
        for part in parts[common:]:
            parent = self.fds[-1] if self.fds else self.root_fd
            self.fds.append(open_dirs(parent, (part,), self.uid, self.gid))
            self.names.append(part)
        return self.fds[-1] if self.fds else self.root_fd

    def replacing(self, parts: tuple[str, ...]) -> None:
        """An entry is about to replace whatever is at `parts`: forget it if it is open."""
        if tuple(self.names[: len(parts)]) == parts:
            self.forget(len(parts) - 1)

    def forget(self, depth: int) -> None:
        for fd in self.fds[depth:]:
            os.close(fd)
        del self.fds[depth:], self.names[depth:]

    def close(self) -> None:
        self.forget(0)


def _member_parts(name: str) -> tuple[str, ...]:
    path = PurePosixPath(name)
    parts = tuple(p for p in path.parts if p != ".")
    if not parts or path.is_absolute() or ".." in parts or "\0" in name:
        raise BadCheckpoint(f"entry {name!r} is outside the workspace")
    return parts


def _restore_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    chain: _DirChain,
    parts: tuple[str, ...],
    uid: int,
    gid: int,
) -> None:
    mode = member.mode & 0o777
    if member.isdir():
        os.fchmod(chain.open(parts), mode | 0o700)  # its owner can always enter and clean it
        return
    if not (member.isreg() or member.issym() or member.islnk()):
        raise BadCheckpoint(f"entry {member.name!r} is neither a file, a directory nor a link")
    target = _link_target(chain.root_fd, member) if member.islnk() else None
    try:
        chain.replacing(parts)
        parent = chain.open(parts[:-1])
        if member.isreg():
            stream = tar.extractfile(member)
            assert stream is not None
            replace_file(parent, parts[-1], b"", mode, uid, gid)
            _copy_stream(stream, parent, parts[-1])
            _set_mtime(parent, parts[-1], member.mtime)
            return
        replace_file(parent, parts[-1], b"", 0o600, uid, gid)  # clears the way
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
