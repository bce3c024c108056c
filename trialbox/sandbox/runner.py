"""The runner: materialize, agent phase, checkpoint, grading phase, raw run report
(docs/sandbox.md, "The runner"). The same steps run under either isolation backend."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from trialbox import __version__
from trialbox.models import iomatch
from trialbox.models.common import FileContent, file_bytes
from trialbox.models.limits import Limits
from trialbox.models.performance import PerformanceReport, PerformanceSpec, copy_s
from trialbox.models.report import (
    CommandResult,
    GradingReport,
    Provenance,
    RunReport,
    Status,
    TestOutcome,
    TestRecord,
)
from trialbox.models.sample import Sample
from trialbox.models.task import Isolation, Task
from trialbox.sandbox import checkpoint_child, checkpoints, fs, processes
from trialbox.sandbox.backend import Backend, CommandSpec, Outcome
from trialbox.sandbox.bwrap import SANDBOX_WORKDIR, BwrapBackend
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.env import sandbox_env
from trialbox.sandbox.grading import (
    SOLUTION_DIR,
    HijackFilter,
    collate,
    grading_argv,
    grading_env,
    hidden_modules,
    neutralized,
    policy_modules,
    protected_modules,
    starter_entries,
)
from trialbox.sandbox.rlimit import RlimitBackend
from trialbox.sandbox.runtime import POLICY_FD_ENV, POLICY_MODULE, Runtime
from trialbox.sandbox.slots import Slot, SlotPool

MiB = 1024 * 1024
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
# Under the slot's root: the solution's files, copied aside for its timed runs (root's only).
TIMED_SOLUTION_DIR = "timed-solution"


class WorkspaceOverflow(Exception):
    """The sample's files do not fit its workspace: the policy's failure, not the sandbox's."""


def command_status(outcome: Outcome) -> Status:
    if outcome.timed_out:
        return Status.TIMEOUT
    if outcome.oom_killed:
        return Status.OOM
    return Status.SUCCEEDED


def command_result(phase: str, argv: list[str], outcome: Outcome) -> CommandResult:
    return CommandResult.model_validate(
        {
            "phase": phase,
            "argv": argv,
            "status": command_status(outcome),
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.timed_out,
            "oom_killed": outcome.oom_killed,
            "wall_s": outcome.wall_s,
            "cpu_s": outcome.cpu_s,
            "peak_memory_mb": outcome.peak_memory_mb,
            "stdout": outcome.stdout.text(),
            "stderr": outcome.stderr.text(),
            "stdout_truncated": outcome.stdout.truncated,
            "stderr_truncated": outcome.stderr.truncated,
        }
    )


NONCE_FD_ENV = "TRIALBOX_REPORT_NONCE_FD"
POLICY_SPEC_FD_ENV = "TRIALBOX_POLICY_SPEC_FD"


def _memfd(data: bytes) -> int:
    """A sealed-off copy of `data` on a descriptor: for a secret no file, argv or env holds."""
    fd = os.memfd_create("trialbox-secret")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _copy(src: Path, dst: Path, prune: fs.Prune, uid: int, limits: Limits) -> list[tuple[str, str]]:
    """One copy of a workspace in a job, bounded (fs.copy_tree: its entries, its data, and the
    deadline the Execute step's budget counts it at: copy_s). A tree past them is an OSError,
    the policy's, as any workspace that cannot be copied."""
    return fs.copy_tree(src, dst, prune, uid, uid, limits.disk_mb * MiB, copy_s(limits.disk_mb))


def _workload_failure(outcome: Outcome) -> str | None:
    if outcome.timed_out:
        return "timed out"
    if outcome.oom_killed:
        return "ran out of memory"
    if outcome.exit_code != 0:
        last = outcome.stderr.text().strip().splitlines()[-1:] or [""]
        return f"exited {outcome.exit_code}: {last[0][:300]}"
    return None


class Runner:
    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig.from_env()
        self.runtime = Runtime.load(self.config.runtime_dir)
        self.backend: Backend = (
            BwrapBackend(self.config, self.runtime)
            if self.config.backend == "bwrap"
            else RlimitBackend(self.config, self.runtime)
        )
        backend = self.backend
        self.slots = SlotPool(self.config, backend.sweep, backend.release, backend.sweep_many)
        self.slots.sweep_idle()  # what a killed runner left behind
        self.protected = protected_modules(self.runtime)

    def residue(self) -> list[str]:
        """What the slots claimed since the last call left where the next job could see it,
        and any process of any slot uid (the worker takes no job while this is not empty)."""
        used, self.slots.used = self.slots.used, set()
        # Only slots no runner holds now: one another runner on this machine holds (the
        # twin's workers share one), or a session of this one, has processes of its own.
        with self.slots.idle(list(range(self.config.slots))) as idle:
            uids = tuple(uid for slot in idle if slot.index in used for uid in slot.uids)
            unused = tuple(uid for slot in idle if slot.index not in used for uid in slot.uids)
            return [
                *self.slots.release_failures,
                *self.backend.residue(uids),
                *(f"process {pid}" for pid in processes.processes_of(unused)),
            ]

    def _sandbox_path(self, host: Path) -> str:
        return SANDBOX_WORKDIR if self.backend.name == "bwrap" else str(host)

    def provenance(self, limits: Limits, grading_timeout_s: float | None = None) -> Provenance:
        return Provenance(
            runner_version=__version__,
            backend=self.backend.name,
            runtime_version=self.runtime.version,
            runtime_hash=self.runtime.hash,
            limits=limits,
            grading_timeout_s=grading_timeout_s,
        )

    def _workspace_spec(
        self,
        argv: Sequence[str],
        slot: Slot,
        limits: Limits,
        role: Literal["agent", "grader"] = "agent",
    ) -> CommandSpec:
        """A command in the slot's workspace, under `limits` and their timeout."""
        return CommandSpec(
            argv=tuple(argv),
            workdir=slot.work_dir,
            role=role,
            limits=limits,
            timeout_s=limits.timeout_s,
            env=sandbox_env(self.runtime, self._sandbox_path(slot.work_dir), limits),
        )

    def exec(self, argv: list[str], limits: Limits, files_dir: Path | None = None) -> CommandResult:
        """One command in a fresh sandbox (`trialbox sandbox exec`)."""
        limits, _ = limits.effective()
        with self.slots.acquire() as slot:
            self.backend.prepare_dir(
                slot.work_dir, limits.disk_mb, slot.agent_uid, slot.agent_uid, 0o700
            )
            if files_dir is not None:
                fs.copy_tree(
                    files_dir,
                    slot.work_dir,
                    lambda *_: None,
                    slot.agent_uid,
                    slot.agent_uid,
                    limits.disk_mb * MiB,
                )
            outcome = self.backend.run(slot, self._workspace_spec(argv, slot, limits))
        return command_result("exec", argv, outcome)

    def run(
        self,
        task: Task,
        sample: Sample,
        limits: Limits | None = None,
        grade: bool = True,
        checkpoint_to: Path | None = None,
        base_checkpoint: bytes | None = None,
        stop: threading.Event | None = None,
    ) -> RunReport:
        """Agent phase, then grading. The workspace is the task's files, or `base_checkpoint`
        (checkpoints.checkpoint's archive: the whole workspace it saved), then the sample's files.
        `checkpoint_to` receives the workspace after the commands. Never raises for the
        sandbox's own failures: the report then has status `sandbox_error` and says why. Once
        `stop` is set, the running command is killed and nothing more runs (`sandbox_error`)."""
        limits, notes = (limits or task.limits).effective()
        grading_timeout = task.grading_timeout_s if grade else None
        commands: list[CommandResult] = []
        try:
            with self.slots.acquire() as held:
                slot = held if stop is None else dataclasses.replace(held, stop=stop)
                grading = self._run_in_slot(
                    slot, task, sample, limits, grade, commands, checkpoint_to, base_checkpoint,
                    notes,
                )  # fmt: skip
        except WorkspaceOverflow as exc:
            why = str(exc)
            grading = (self._ungradable(task, why), Status.SUCCEEDED) if grade else None
            notes = [*notes, why]
        except Exception as exc:  # the runner's own failure: no reward, never a crash
            return RunReport(
                task_id=task.task_id,
                sample_id=sample.sample_id,
                status=Status.SANDBOX_ERROR,
                commands=commands,
                grading=None,
                notes=notes,
                error=f"{type(exc).__name__}: {exc}",
                provenance=self.provenance(limits, grading_timeout),
            )
        if grading is not None:
            status = grading[1]
        else:
            status = next(
                (c.status for c in commands if c.status != Status.SUCCEEDED), Status.SUCCEEDED
            )
        return RunReport(
            task_id=task.task_id,
            sample_id=sample.sample_id,
            status=status,
            commands=commands,
            grading=grading[0] if grading else None,
            notes=notes,
            provenance=self.provenance(limits, grading_timeout),
        )

    def _run_in_slot(
        self,
        slot: Slot,
        task: Task,
        sample: Sample,
        limits: Limits,
        grade: bool,
        commands: list[CommandResult],
        checkpoint_to: Path | None,
        base_checkpoint: bytes | None,
        notes: list[str],
    ) -> tuple[GradingReport, Status] | None:
        uid = slot.agent_uid
        self.backend.prepare_dir(slot.work_dir, limits.disk_mb, uid, uid, 0o700)

        # Nothing has run in the fresh workspace yet, so nothing there can be a planted link.
        # A base checkpoint is the whole workspace it saved, starter files included (or
        # deleted), so it replaces them. Every file goes in by a child in the slot's own
        # accounting: what the workspace holds counts against memory_mb, whoever wrote it.
        def unpack(archive: bytes, compressed: bool) -> None:
            checkpoint_child.unpack(slot.work_dir, archive, uid, limits.disk_mb * MiB,
                                    checkpoint_child.cpu_budget_s(limits),
                                    self.backend.accounting(slot, limits), compressed)  # fmt: skip

        # A starter file the sample's own replaces is never written: it would be overwritten
        # at once (one child fewer, about 5 ms, for a sample that rewrites its one starter).
        starter = {path: c for path, c in task.workspace.items() if path not in sample.files}
        if base_checkpoint is None and starter:
            unpack(checkpoint_child.files_archive(starter), compressed=False)
        # The policy's own files overflowing its workspace are its failure, scored 0 like a
        # disk it filled from a command; never a sandbox_error, whose loss mask would teach
        # padding files as a way out of a 0 reward. A full host disk is a sandbox_error.
        overflow = WorkspaceOverflow(
            f"the sample's files do not fit the {limits.disk_mb} MiB workspace; nothing ran"
        )
        if sum(len(file_bytes(c)) for c in sample.files.values()) > limits.disk_mb * MiB:
            raise overflow
        try:
            if base_checkpoint is not None:
                unpack(base_checkpoint, compressed=True)
            if sample.files:
                unpack(checkpoint_child.files_archive(sample.files), compressed=False)
        except checkpoints.CheckpointTooLarge as exc:
            raise overflow from exc
        except OSError as exc:
            if exc.errno in DISK_FULL and self.backend.caps_workspace:
                raise overflow from exc
            raise
        for argv in sample.commands:
            outcome = self.backend.run(slot, self._workspace_spec(argv, slot, limits))
            commands.append(command_result("agent", argv, outcome))
        processes.kill_all((uid,))  # the agent's leftovers, before anything reads its files
        if checkpoint_to is not None:
            try:
                data = checkpoints.checkpoint(slot.work_dir, limits.disk_mb * MiB)
                checkpoint_to.write_bytes(data)
            except checkpoints.CheckpointTooLarge as exc:  # never restorable: none is kept
                notes.append(f"no checkpoint: {exc}")
        if not grade:
            return None
        if task.grading.performance is None:
            return self._grade(slot, task, limits, commands, None)
        aside = self._set_aside(slot, limits)
        try:
            return self._grade(slot, task, limits, commands, aside)
        finally:
            self.backend.release_dir(slot.root / TIMED_SOLUTION_DIR)

    def _ungradable(self, task: Task, reason: str) -> GradingReport:
        expected = task.grading.expected_tests or []
        return GradingReport(
            command=[],
            pytest_exit_code=None,
            tests=[
                TestRecord(test_id=t, outcome=TestOutcome.MISSING, message="not run")
                for t in expected
            ],
            expected_tests=expected,
            expected_tests_unknown=task.grading.expected_tests is None,
            neutralized=[],
            anomalies=[f"grading_setup_failed: {reason}"],
        )

    def _set_aside(self, slot: Slot, limits: Limits) -> str | None:
        """The solution's files for its timed runs, copied aside as the agent left them,
        before grading runs any of its code (the boundary process works in the workspace):
        root's, where no sandbox sees them. Returns why they could not be, or None."""
        aside = slot.root / TIMED_SOLUTION_DIR
        self.backend.prepare_dir(aside, limits.disk_mb + 1, 0, 0, 0o700)
        try:
            _copy(slot.work_dir, aside, lambda *_: None, 0, limits)
        except OSError as exc:  # what the agent left cannot be copied: as at grading
            return f"could not be copied for its timed runs ({type(exc).__name__}: {exc})"
        return None

    def _measure(
        self, slot: Slot, task: Task, spec: PerformanceSpec, limits: Limits, aside: str | None
    ) -> PerformanceReport:
        """The performance scorer's runs: the workload beside the reference's files (as the
        grader's uid, read-only) and beside the solution's (as the agent's), interleaved, each
        measured by the backend from outside: CPU seconds and peak MiB.

        Every run starts from the same pristine state, so nothing one run does reaches
        another: the slot swept (no process of its uids, nothing they wrote anywhere, and under
        bwrap a new cgroup with no memory charged to it), then a new workspace that holds only
        its side's files, written by the runner: the reference's, or the solution's as they
        were set aside before grading. So a reference run cannot have been disturbed by the
        solution, and its failure stays the scorer's own (a reference that fails alone).
        `aside`: why the solution's files could not be set aside (its failure), or None."""
        if aside is not None:
            return PerformanceReport(policy_failed=f"the solution's workspace {aside}")
        argv = ("python", "-c", spec.workload)
        roles: dict[str, Literal["agent", "grader"]] = {"reference": "grader", "policy": "agent"}
        report = PerformanceReport()
        expected: str | None = None  # what the reference's workload printed, first time
        for turn in range(spec.repeats):
            for side in ("reference", "policy") if turn % 2 == 0 else ("policy", "reference"):
                try:
                    self._fresh_workspace(slot, task, limits, side)
                except OSError as exc:
                    if side == "reference":
                        raise  # the task's files, in a swept slot: the platform's
                    report.policy_failed = f"the solution's workspace {exc}"
                    return report
                run = self._workspace_spec(argv, slot, limits, roles[side])
                outcome = self.backend.run(slot, run)
                failed = _workload_failure(outcome)
                if failed is None and side == "reference" and expected is None:
                    expected = outcome.stdout.text()
                elif failed is None and side == "policy" and outcome.stdout.text() != expected:
                    # A timed run must compute what the graded one did: a solution that
                    # takes a shortcut when it is not under test prints something else.
                    failed = "printed other results than the reference's workload did"
                if failed is not None:
                    if side == "reference":
                        report.reference_failed = f"the reference's workload {failed}"
                    else:
                        report.policy_failed = f"the solution's workload {failed}"
                    return report
                cpu, peak = (
                    (report.reference_cpu_s, report.reference_peak_mb)
                    if side == "reference"
                    else (report.policy_cpu_s, report.policy_peak_mb)
                )
                cpu.append(outcome.cpu_s)
                peak.append(outcome.peak_memory_mb)
        return report

    def _fresh_workspace(self, slot: Slot, task: Task, limits: Limits, side: str) -> None:
        """A swept slot and a new workspace with only this side's files in it."""
        assert task.reference is not None
        self.backend.sweep(slot)
        if side == "reference":
            self.backend.prepare_dir(
                slot.work_dir, limits.disk_mb + 1, 0, slot.grader_uid, 0o750, fs.WORKSPACE_INODES
            )
            fs.write_files(slot.work_dir, task.reference, 0, 0)
            return
        uid = slot.agent_uid
        self.backend.prepare_dir(slot.work_dir, limits.disk_mb, uid, uid, 0o700)
        aside = slot.root / TIMED_SOLUTION_DIR
        _copy(aside, slot.work_dir, lambda *_: None, uid, limits)

    def _boundary(self, grader: CommandSpec, slot: Slot, task: Task) -> CommandSpec:
        """The grader's spec with the policy's process beside it: the zygote of
        trialbox_policy, as the agent's uid in the agent's workspace, on a control socket only
        the two hold."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        workspace = self._sandbox_path(slot.work_dir)
        env = sandbox_env(self.runtime, workspace, grader.limits)
        env["PYTHONPATH"] = str(self.runtime.plugin_dir)
        companion = CommandSpec(
            argv=("python", "-P", "-m", POLICY_MODULE),
            workdir=slot.work_dir,
            role="agent",
            limits=grader.limits,
            timeout_s=grader.timeout_s,
            env=env,
            inherit=((POLICY_FD_ENV, theirs.detach()),),
        )
        control = (POLICY_FD_ENV, ours.detach())
        # The grading time the policy's calls may use: pytest keeps the rest to report.
        budget = max(grader.timeout_s * 0.8, grader.timeout_s - 2.0)
        # On a descriptor, not in env: a workspace of many modules would pass the kernel's
        # limit on one variable (E2BIG: the sandbox's failure, for what the policy wrote).
        spec = {
            "budget_s": budget,
            "modules": policy_modules(slot.work_dir, self.protected | hidden_modules(task)),
            "hidden": sorted(task.hidden_tests),
        }
        described = (POLICY_SPEC_FD_ENV, _memfd(json.dumps(spec).encode()))
        inherit = (*grader.inherit, control, described)
        return dataclasses.replace(grader, companion=companion, inherit=inherit)

    def _grade(
        self,
        slot: Slot,
        task: Task,
        limits: Limits,
        commands: list[CommandResult],
        aside: str | None,
    ) -> tuple[GradingReport, Status]:
        """`aside`: for the performance scorer, `_set_aside`'s answer."""
        hidden_mb = sum(len(file_bytes(c)) for c in task.hidden_tests.values()) // MiB
        # Readable by the grader's group only: under rlimit, other slots can traverse /slots.
        self.backend.prepare_dir(
            slot.grade_dir,
            limits.disk_mb + hidden_mb + 1,
            0,
            slot.grader_uid,
            0o750,
            inodes=2 * fs.WORKSPACE_INODES + len(task.hidden_tests),
        )
        trusted = frozenset(task.workspace) | frozenset(task.hidden_tests)
        boundary = task.grading.isolation == Isolation.BOUNDARY
        skip = HijackFilter(slot.work_dir, self.protected, trusted, boundary)
        try:
            left_out = _copy(slot.work_dir, slot.grade_dir, skip, 0, limits)
            if not boundary:  # the starter's modules, importable from a directory of their own
                solution = slot.grade_dir / SOLUTION_DIR
                solution.mkdir(mode=0o755)
                prune = skip.solution_tree(starter_entries(task.workspace))
                _copy(slot.work_dir, solution, prune, 0, limits)
            # Root-owned, mode 644/755: readable, never writable, by the grader's uid. The
            # hidden tests win every collision with what the agent left.
            fs.write_files(slot.grade_dir, dict[str, FileContent](task.hidden_tests), 0, 0)
        except OSError as exc:
            # The agent's tree could not be graded (say, it filled the disk): its failure.
            why = f"the workspace could not be copied ({type(exc).__name__}: {exc})"
            return self._ungradable(task, why), Status.SUCCEEDED
        root = self._sandbox_path(slot.grade_dir)
        argv = grading_argv(task.grading.command, self.runtime, root)
        nonce = secrets.token_hex(16)
        env = sandbox_env(self.runtime, root, limits)
        env = grading_env(env, self.runtime, root)
        channel = None
        if task.grading.io is not None:  # the hidden cases, on a descriptor only the grader reads
            channel = (iomatch.CASES_FD_ENV, task.grading.io.payload())
        spec = CommandSpec(
            argv=tuple(argv),
            workdir=slot.grade_dir,
            role="grader",
            limits=limits,
            timeout_s=task.grading_timeout_s,
            env=env,
            report=True,
            channel=channel,
            inherit=((NONCE_FD_ENV, _memfd(nonce.encode())),),
        )
        if boundary:
            spec = self._boundary(spec, slot, task)
        outcome = self.backend.run(slot, spec)
        result = command_result("grading", argv, outcome)
        commands.append(result)
        collated = collate(
            outcome.report,
            nonce,
            task.grading.expected_tests,
            task.hidden_tests,
            outcome.exit_code,
            outcome.report_overflowed,
        )
        if collated.policy_timeout and result.status == Status.SUCCEEDED:
            result.status = Status.TIMEOUT  # the solution's code, not the grader, ran out of time
        performance = None
        spec_perf = task.grading.performance
        if spec_perf is not None and any(t.outcome == TestOutcome.PASSED for t in collated.tests):
            performance = self._measure(slot, task, spec_perf, limits, aside)
        report = GradingReport(
            command=argv,
            pytest_exit_code=outcome.exit_code,
            tests=collated.tests,
            expected_tests=collated.expected,
            expected_tests_unknown=task.grading.expected_tests is None,
            neutralized=neutralized(left_out),
            anomalies=collated.anomalies,
            integrity=collated.integrity,
            performance=performance,
        )
        return report, result.status
