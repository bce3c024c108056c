"""bubblewrap backend (local, CI, laptops): every namespace, no network, a private /tmp, a
read-only system, and a per-command cgroup. bwrap starts as the slot's unprivileged host uid:
`bwrap --uid` launched by root would map to host uid 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from trialbox.errors import SandboxSetupError
from trialbox.models.limits import Limits
from trialbox.sandbox import processes, seccomp
from trialbox.sandbox.backend import Backend, CommandSpec, Launched, Measured
from trialbox.sandbox.bwrap_warm import warm_launch
from trialbox.sandbox.cgroups import Cgroup, cgroup_class
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.fs import mount_tmpfs, remove_tree, unmount
from trialbox.sandbox.runtime import Runtime
from trialbox.sandbox.shared_files import publish
from trialbox.sandbox.slots import Slot
from trialbox.sandbox.warm import WarmPool

SANDBOX_WORKDIR = "/workspace"
# The launch shim runs as root just long enough to join the cgroups, then execs setpriv.
JOIN_SHIM = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
HOST_LINKS = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")


class BwrapLaunched(Launched):
    def __init__(
        self, proc: subprocess.Popen[bytes], cgroup: Cgroup, status_fd: int, joined: bool
    ) -> None:
        """`joined`: started in the cgroup of the slot's running command (a companion)."""
        super().__init__(proc)
        self.cgroup = cgroup
        self.status_fd = status_fd
        self.joined = joined

    def kill_tree(self) -> None:
        if self.joined:
            # Its own sandbox only, never the cgroup, which the slot's command runs in: bwrap
            # killed, the sandbox's pid 1 dies with it (--die-with-parent), and the kernel
            # kills the rest of its pid namespace. (The command's own end kills the cgroup.)
            self.proc.kill()
        else:
            self.cgroup.kill_all()

    def discard(self) -> None:
        super().discard()
        if self.status_fd >= 0:
            os.close(self.status_fd)
            self.status_fd = -1

    def finish(self, returncode: int) -> Measured:
        with os.fdopen(self.status_fd, "rb") as status:
            documents = status.read().decode(errors="replace")
        decoder = json.JSONDecoder()
        seen: dict[str, object] = {}
        text = documents.strip()
        while text:
            try:
                doc, end = decoder.raw_decode(text)
            except ValueError:
                break
            if isinstance(doc, dict):
                seen.update(doc)
            text = text[end:].strip()
        stats = self.cgroup.stats()
        if not self.cgroup.REUSABLE:
            self.cgroup.remove()
        exit_code = seen.get("exit-code", returncode)
        return Measured(
            exit_code=exit_code if isinstance(exit_code, int) else returncode,
            cpu_s=stats.cpu_s,
            peak_memory_mb=stats.peak_memory_mb,
            oom_killed=stats.oom_kills > 0,
            started="child-pid" in seen,
            error=None if "child-pid" in seen else f"bwrap failed to start (exit {returncode})",
        )


class BwrapBackend(Backend):
    name = "bwrap"
    caps_workspace = True  # a size-capped tmpfs: a full disk is the sample's own

    def __init__(self, config: SandboxConfig, runtime: Runtime) -> None:
        for tool in ("bwrap", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxSetupError(f"{tool} is not installed; run `make setup`")
        self.config = config
        self.runtime = runtime
        self.cgroup_cls = cgroup_class(config.cgroup_root)
        self._cgroups: dict[int, Cgroup] = {}
        self.etc_dir = config.state_dir / "etc"
        self._write_etc()
        self.warm = WarmPool(runtime.python) if config.warm else None
        # By slot: what its warm command and companion share with their warm processes.
        self.shared_mb: dict[int, float] = {}
        # Per slot, a companion's holder started beside its command's (bwrap_warm.py).
        self.early_holders: dict[int, BwrapLaunched] = {}
        self.sandbox_workdir = Path(SANDBOX_WORKDIR)

    def _write_etc(self) -> None:
        """A minimal /etc for the sandbox: no shadow, no resolv.conf, nothing of the host's."""
        self.etc_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        users = ["root:x:0:0:root:/root:/usr/sbin/nologin"]
        groups = ["root:x:0:"]
        for index in range(self.config.slots):
            for role, uid in (("agent", 0), ("grader", 1)):
                n = self.config.uid_base + 2 * index + uid
                users.append(f"sandbox{n}:x:{n}:{n}:{role}:{SANDBOX_WORKDIR}:/usr/sbin/nologin")
                groups.append(f"sandbox{n}:x:{n}:")
        users.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
        files = {
            "passwd": "\n".join(users) + "\n",
            "group": "\n".join(groups) + "\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
        }
        for name, text in files.items():  # sandboxes of other runners may be reading them
            publish(self.etc_dir / name, text.encode())
        cache = Path("/etc/ld.so.cache")
        if cache.exists():
            publish(self.etc_dir / "ld.so.cache", cache.read_bytes())

    def prepare_dir(
        self, path: Path, size_mb: int, owner: int, group: int, mode: int, inodes: int = 65536
    ) -> None:
        self.release_dir(path)
        path.mkdir(mode=0o700)
        mount_tmpfs(path, size_mb, owner, group, mode, inodes)

    def release_dir(self, path: Path) -> None:
        if path.exists():
            unmount(path)
            remove_tree(path)  # empty once unmounted, unless the rlimit backend left it there

    def _cgroup(self, slot: Slot) -> Cgroup:
        if slot.index not in self._cgroups:
            self._cgroups[slot.index] = self.cgroup_cls(
                self.config.cgroup_root, self.config.cgroup_parent, slot.cgroup_name
            )
        return self._cgroups[slot.index]

    def discard_early_holder(self, slot: Slot) -> None:
        """Reap a companion's holder its command never took, once the slot's cgroup (which
        it joined) is killed: the command's end, or its launch's failure."""
        holder = self.early_holders.pop(slot.index, None)
        if holder is not None:
            holder.discard()

    def accounting(self, slot: Slot, limits: Limits) -> tuple[Path, ...]:
        """The slot's cgroup, with `limits` and zeroed counters (nothing of the slot runs
        between a session's commands): the helper's CPU and memory are the slot's."""
        cgroup = self._cgroup(slot)
        cgroup.create(limits.memory_mb, limits.pids, limits.cpus)
        return tuple(cgroup.procs_files)

    def sweep(self, slot: Slot) -> None:
        self._cgroup(slot).remove()
        processes.kill_all(slot.uids)
        self.release(slot)

    def release(self, slot: Slot) -> None:
        # Every process of the slot is in its cgroup (a member cannot leave it), so an empty
        # cgroup means nothing of the slot runs.
        cgroup = self._cgroup(slot)
        if not cgroup.wait_empty():
            raise SandboxSetupError(f"slot {slot.index}: processes survived SIGKILL")
        for path in (slot.work_dir, slot.grade_dir):
            self.release_dir(path)
        # Removed, not kept for the next holder: on v1 the page cache this holder's commands
        # read (numpy's libraries, a file it read) stays charged to the memory cgroup that read
        # it, and would count in every later sample's usage and peak on the slot. A new cgroup
        # is not charged for pages that stay cached.
        cgroup.remove()
        slot.root.mkdir(parents=True, exist_ok=True)
        slot.root.chmod(0o711)

    def _bwrap_args(self, spec: CommandSpec, status_fd: int, seccomp_fd: int) -> list[str]:
        args = [
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in HOST_LINKS:
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        root = str(self.runtime.root)
        workspace_bind = "--bind" if spec.role == "agent" else "--ro-bind"
        args += ["--ro-bind", str(self.etc_dir), "/etc", "--ro-bind", root, root]
        size = str(spec.limits.disk_mb * 1024 * 1024)
        args += ["--proc", "/proc", "--dev", "/dev"]
        # Every writable place is a tmpfs capped at disk_mb; the rest of the tree read-only.
        args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]
        args += [workspace_bind, str(spec.workdir), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        args += ["--clearenv"]
        for key, value in spec.env.items():
            args += ["--setenv", key, value]
        args += ["--seccomp", str(seccomp_fd), "--json-status-fd", str(status_fd), "--"]
        return args

    def launch(self, slot: Slot, spec: CommandSpec, fds: list[int], join: bool = False) -> Launched:
        """The grader's and the policy's interpreter forked from a warm one into a sandbox made
        for the command (bwrap_warm.py) where it can be; every other command started cold."""
        launched = warm_launch(self, slot, spec, fds, join)
        return launched if launched is not None else self.launch_cold(slot, spec, fds, join)

    def launch_cold(
        self,
        slot: Slot,
        spec: CommandSpec,
        fds: list[int],
        join: bool = False,
        as_pid_1: bool = False,
    ) -> BwrapLaunched:
        """`as_pid_1`: the command is the sandbox's pid 1, without bwrap's init (a warm
        command's holder)."""
        uid = slot.agent_uid if spec.role == "agent" else slot.grader_uid
        cgroup = self._cgroup(slot)
        if not join:
            cgroup.create(spec.limits.memory_mb, spec.limits.pids, spec.limits.cpus)
        status_r, status_w = os.pipe()
        filter_fd = os.memfd_create("trialbox-seccomp")
        os.write(filter_fd, seccomp.program())
        os.lseek(filter_fd, 0, os.SEEK_SET)
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        drop += ["--no-new-privs", "--inh-caps=-all", "--"]
        argv = ["/bin/sh", "-c", JOIN_SHIM, "sh", *map(str, cgroup.procs_files), "--"]
        bwrap = self._bwrap_args(spec, status_w, filter_fd)
        if as_pid_1:
            bwrap.insert(1, "--as-pid-1")
        argv += [*drop, *bwrap, *spec.argv]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[status_w, filter_fd, *fds],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                cwd="/",  # bwrap's init keeps this environment: nothing of the runner's
                start_new_session=True,
            )
        except BaseException:
            os.close(status_r)
            if not join:
                with contextlib.suppress(SandboxSetupError):
                    cgroup.remove()
            raise
        finally:
            os.close(status_w)
            os.close(filter_fd)
        return BwrapLaunched(proc, cgroup, status_r, join)
