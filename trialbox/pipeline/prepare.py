"""Prepare: resolve the task, merge limits (a request may only tighten them), write the job
spec, and answer with a small reference and the Execute step's timeouts."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from trialbox.constants import NOT_TAKEN_AFTER_S
from trialbox.errors import RequestRejected
from trialbox.keys import checkpoint_key, job_key, taskset_key
from trialbox.models import ExecutionRequest, Task, TaskRef
from trialbox.models.jobs import JobRef, JobSpec, RolloutInput
from trialbox.models.performance import copy_s
from trialbox.pipeline.admission import shard
from trialbox.pipeline.record import validation_message
from trialbox.pipeline.stores import ObjectStore

TASKSETS_KEPT = 8  # task sets a warm Prepare function keeps parsed
# The grading tree, and the solution's modules in a directory of their own beside it.
GRADING_COPIES = 2


@dataclass
class Preparer:
    tasksets: ObjectStore
    jobs: ObjectStore
    heartbeat_s: int
    margin_s: int
    _tasksets: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def __call__(self, rollout: RolloutInput) -> JobRef:
        request = self._request(rollout)
        task, taskset_sha = self._task(request)
        if request.base_checkpoint is not None:
            self._check_checkpoint(request.base_checkpoint)
        limits = request.limits.tighten(task.limits)
        job = JobSpec(
            request_id=request.request_id,
            sample_id=request.sample_id,
            task=task,
            files=request.files,
            commands=request.commands,
            grade=request.grade,
            base_checkpoint=request.base_checkpoint,
            checkpoint=request.checkpoint,
            limits=limits,
            taskset_sha256=taskset_sha,
            queued_at=time.time(),
        )
        uri = self.jobs.put_json(job_key(request.request_id, "job.json"), job)
        # The runner enforces each command's deadline itself; the token timeout only catches
        # a sandbox that vanished. Its clock starts when the job is queued, and a job may wait
        # up to one heartbeat for a worker (longer, and the heartbeat lapses first: a job no
        # worker took is sent again, max_waits times, never counted as a lost sandbox), so it
        # sits beyond that wait plus the runner's worst case plus a margin. The worst case is
        # every run the job can make, and every copy of its workspace, each at its deadline:
        # its commands, the grading (and the copies it grades) and the performance scorer's
        # timed runs (and the copies of the solution's files they start from).
        grading_s = 0.0
        if request.grade:
            grading_s = task.grading.timeout_for(limits.timeout_s)
            grading_s += GRADING_COPIES * copy_s(limits.disk_mb)
            if task.grading.performance is not None:
                grading_s += task.grading.performance.runs_s(limits.timeout_s, limits.disk_mb)
        worst = len(request.commands) * limits.timeout_s + grading_s
        timeout_s = self.heartbeat_s + math.ceil(worst) + self.margin_s
        return JobRef(
            request_id=request.request_id,
            job_uri=uri,
            timeout_s=timeout_s,
            heartbeat_s=self.heartbeat_s,
            admission_part=shard(request.request_id),
            max_waits=math.ceil(max(NOT_TAKEN_AFTER_S, timeout_s) / self.heartbeat_s),
        )

    def _check_checkpoint(self, checkpoint: str) -> None:
        try:
            self.jobs.s3.head_object(Bucket=self.jobs.bucket, Key=checkpoint_key(checkpoint))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
                raise
            raise RequestRejected(
                f"base_checkpoint: no checkpoint {checkpoint}; a checkpoint is what a result's "
                "`checkpoint` names, after a request with checkpoint=true"
            ) from exc

    def _request(self, rollout: RolloutInput) -> ExecutionRequest:
        if rollout.request is not None:
            return rollout.request
        if rollout.payload_uri is None:
            raise RequestRejected("the execution input has neither a request nor a payload_uri")
        try:
            return ExecutionRequest.model_validate_json(self.jobs.get_bytes(rollout.payload_uri))
        except ValidationError as exc:
            raise RequestRejected(validation_message(exc)) from exc

    def _task(self, request: ExecutionRequest) -> tuple[Task, str | None]:
        if request.task is not None:
            return request.task, None
        assert request.task_ref is not None
        ref = TaskRef.parse(request.task_ref)
        raw = self._taskset(ref.taskset, ref.version).get(ref.task_id)
        if raw is None:
            raise RequestRejected(
                f"task_ref: no task {ref.task_id!r} in {ref.taskset}@{ref.version}"
            )
        try:
            return Task.model_validate(raw), ref.version
        except ValidationError as exc:
            raise RequestRejected(f"task {ref}: {validation_message(exc)}") from exc

    def _taskset(self, taskset: str, version: str) -> dict[str, Any]:
        """A task set's tasks by id. Versions are content hashes, so a warm function keeps
        the last few instead of reading the whole file for every request."""
        key = taskset_key(taskset, version)
        if key in self._tasksets:
            return self._tasksets[key]
        try:
            body = self.tasksets.get_bytes(self.tasksets.uri(key))
        except self.tasksets.s3.exceptions.NoSuchKey as exc:
            raise RequestRejected(f"task_ref: task set {taskset}@{version} not found") from exc
        tasks: dict[str, Any] = {}
        for number, line in enumerate(body.decode(errors="replace").split("\n"), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except (ValueError, RecursionError) as exc:  # nested past the parser's depth too
                raise RequestRejected(
                    f"task set {taskset}@{version}: line {number} is not JSON"
                ) from exc
            if isinstance(raw, dict) and isinstance(raw.get("task_id"), str):
                tasks.setdefault(raw["task_id"], raw)
        while len(self._tasksets) >= TASKSETS_KEPT:
            del self._tasksets[next(iter(self._tasksets))]
        self._tasksets[key] = tasks
        return tasks
