"""A session's workspace: one slot held across many tool calls. It is materialized like a
job's (the task's files, then a checkpoint, then overlay files); each command runs in a fresh
sandbox of the slot with the session's limits, and whatever a command left running is killed
before the call returns (only files carry over, as in a checkpoint). `release` gives the slot
back; the session's state is then only its last checkpoint."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path, PurePosixPath

from trialbox.models.common import FileContent, file_bytes
from trialbox.models.limits import Limits
from trialbox.models.report import CommandResult
from trialbox.sandbox import checkpoint_child, checkpoints, fs, processes
from trialbox.sandbox.runner import DISK_FULL, MiB, Runner, command_result
from trialbox.sandbox.slots import Slot

log = logging.getLogger("trialbox.sandbox")

MAX_READ_BYTES = 4 * MiB


class WorkspaceError(ValueError):
    """A call the workspace cannot carry out (a file too large or missing, files that do not
    fit): the policy's mistake, told back to it."""


class SessionWorkspace:
    def __init__(
        self,
        runner: Runner,
        workspace: dict[str, FileContent],
        limits: Limits,
        checkpoint: bytes | None = None,
        files: dict[str, FileContent] | None = None,
    ) -> None:
        self.runner = runner
        self.limits, self.notes = limits.effective()
        self._hold = contextlib.ExitStack()
        self.slot: Slot = self._hold.enter_context(runner.slots.acquire(job=False))
        self._fingerprint: str | None = None  # the tree as it was at the last checkpoint
        self.checkpoint_cpu_s = 0.0  # the CPU its checkpoints' builders took, in all
        try:
            uid = self.slot.agent_uid
            runner.backend.prepare_dir(self.slot.work_dir, self.limits.disk_mb, uid, uid, 0o700)
            if checkpoint is None:
                self.write(workspace)
            else:  # the whole workspace it saved, starter files included (or deleted)
                self._restore(checkpoint)
            if files:
                self.write(files)
        except BaseException:
            self._hold.close()
            raise

    def _unpack(self, archive: bytes, compressed: bool) -> None:
        """Unpacked by a child in the slot's own accounting (checkpoint_child.unpack): what
        the workspace holds is the sandbox's memory and CPU whoever wrote it."""
        checkpoint_child.unpack(
            self.slot.work_dir,
            archive,
            self.slot.agent_uid,
            self.capacity,
            checkpoint_child.cpu_budget_s(self.limits),
            self.runner.backend.accounting(self.slot, self.limits),
            compressed,
        )

    def _restore(self, checkpoint: bytes) -> None:
        """A checkpoint never stores what its restore would not fit (checkpoints.Budget); one that
        does not fit anyway (its pages past memory_mb included) is the policy's, as the grade
        scores it (never a masked error)."""
        try:
            self._unpack(checkpoint, compressed=True)
        except checkpoints.CheckpointTooLarge as exc:
            raise WorkspaceError(f"the last checkpoint does not fit the workspace: {exc}") from exc
        except OSError as exc:
            if exc.errno in DISK_FULL and self.runner.backend.caps_workspace:
                raise WorkspaceError(
                    f"the last checkpoint does not fit the {self.limits.disk_mb} MiB workspace: "
                    f"{exc.strerror}"
                ) from exc
            raise

    @property
    def capacity(self) -> int:
        return self.limits.disk_mb * MiB

    def exec(self, argv: list[str], timeout_s: float | None = None) -> CommandResult:
        """One command; a timeout or OOM is this call's result, the workspace goes on."""
        limits = self.limits
        if timeout_s is not None:
            limits = limits.model_copy(update={"timeout_s": min(timeout_s, limits.timeout_s)})
        spec = self.runner._workspace_spec(argv, self.slot, limits)
        try:
            outcome = self.runner.backend.run(self.slot, spec)
        finally:
            processes.kill_all((self.slot.agent_uid,))
        return command_result("exec", argv, outcome)

    def write(self, files: dict[str, FileContent]) -> None:
        if not files:
            return
        if sum(len(file_bytes(c)) for c in files.values()) > self.capacity:
            raise WorkspaceError(f"the files do not fit the {self.limits.disk_mb} MiB workspace")
        try:
            self._unpack(checkpoint_child.files_archive(files), compressed=False)
        except checkpoints.CheckpointTooLarge as exc:
            raise WorkspaceError(f"the files do not fit the workspace: {exc}") from exc
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise WorkspaceError(
                    f"the workspace is full ({self.limits.disk_mb} MiB): {exc.strerror}"
                ) from exc
            raise

    def read(self, path: str) -> bytes:
        """A regular file's bytes, never through a link. Anything else at `path` (nothing, a
        directory, a socket, a FIFO, a link) is the policy's WorkspaceError, whatever the
        error opening it was: what the file is decides, not the errno."""
        try:
            return fs.read_file(self.slot.work_dir, path, MAX_READ_BYTES)
        except fs.NotAFile as exc:
            raise WorkspaceError(str(exc)) from exc
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise WorkspaceError(f"{path[:80]}...: a name too long") from exc
            what = _what_is(self.slot.work_dir, PurePosixPath(path).parts)
            if what is None:  # a regular file the platform could not read
                raise
            raise WorkspaceError(f"{path}: {what}") from exc

    def checkpoint(self) -> bytes | None:
        """The workspace's archive, or None when nothing changed since the last one
        (checkpoints.fingerprint: the tree's metadata, the same only for the same tree once
        settled). Built by a child in the slot's own accounting (checkpoint_child), under the
        CPU budget of one command: its CPU is the session's, `checkpoint_cpu_s`. Raises
        WorkspaceError when a restore would not fit the workspace (a sparse file counts in
        full), or the session's own limits cannot archive it: such a state is the policy's."""
        now = checkpoints.fingerprint(self.slot.work_dir)
        if now is not None and now == self._fingerprint:
            return None
        budget_s = checkpoint_child.cpu_budget_s(self.limits)
        accounting = self.runner.backend.accounting(self.slot, self.limits)
        try:
            built = checkpoint_child.build(self.slot.work_dir, self.capacity, budget_s, accounting)
        except checkpoints.CheckpointTooLarge as exc:
            raise WorkspaceError(f"{exc}; the call is undone") from exc
        self._fingerprint = now
        self.checkpoint_cpu_s += built.cpu_s
        return built.data

    def release(self) -> None:
        """Kill what runs, give the slot back (idempotent)."""
        try:
            processes.kill_all((self.slot.agent_uid,))
        except Exception:  # the slot's wipe check finds what survived, and quarantines it
            log.exception("session slot %d: killing the agent's processes failed", self.slot.index)
        self._hold.close()
        self.runner.slots.used.add(self.slot.index)  # the next wipe check inspects it


KINDS = {stat.S_IFDIR: "a directory", stat.S_IFLNK: "a link", stat.S_IFSOCK: "a socket",
         stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}  # fmt: skip


def _what_is(root: Path, parts: tuple[str, ...]) -> str | None:
    """What stands at `parts` under `root` when it is not a regular file (walked without
    following a link); None for a regular file."""
    fd = os.open(root, fs.DIR_FLAGS)
    try:
        for depth, part in enumerate(parts):
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return "no such file in the workspace"
            if depth == len(parts) - 1:
                if stat.S_ISREG(info.st_mode):
                    return None
                kind = KINDS.get(stat.S_IFMT(info.st_mode), "something else")
                return f"not a regular file ({kind})"
            if not stat.S_ISDIR(info.st_mode):
                return "no such file in the workspace"
            next_fd = os.open(part, fs.DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return "not a regular file (a directory)"  # no name: the workspace itself
    finally:
        os.close(fd)
