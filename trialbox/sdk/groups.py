"""GRPO groups: N completions for one task become N requests, or a `no_code` result each."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence

from pydantic import ValidationError

from trialbox.errors import InputError
from trialbox.models import (
    ExecutionRequest,
    ExecutionResult,
    Status,
    Task,
    result_for,
    ungradable,
)
from trialbox.models.sample import written_by_policy
from trialbox.pipeline.record import validation_message
from trialbox.sdk.extract import (
    NO_CODE_FEEDBACK,
    NO_CODE_FLAG,
    Extract,
    defined_names,
    extract_code,
    files_for,
)
from trialbox.sdk.tasksets import request_id

__all__ = ["Extract", "extract_code", "plan"]


def plan(
    task: Task,
    task_ref: str,
    completions: Sequence[str],
    extract: Extract,
    group_id: str | None,
) -> list[ExecutionRequest | ExecutionResult]:
    """Per completion, in order: the request that grades its code, or (no code found) its
    result. The default group id hashes the task and the files each completion submits, so the
    same group submitted again is the same requests (each runs once)."""
    if extract is extract_code:  # the default: it knows what the starter file defines
        starters = [
            c for p, c in task.workspace.items() if p.endswith(".py") and isinstance(c, str)
        ]
        defines = set().union(*(defined_names(c) for c in starters))
        io = task.grading.io
        if io is not None and io.fn_name is not None:  # a call-based task calls this name
            defines |= {io.fn_name, "Solution"}
        extract = functools.partial(extract_code, defines=defines)
    files: list[dict[str, str] | None] = []
    for index, completion in enumerate(completions):
        try:
            files.append(files_for(task.workspace, extract(completion)) or None)  # {}: no code
        except InputError as exc:  # the task's or the extract function's: the trainer's
            raise InputError(f"completion {index}: {exc}") from None
    if group_id is None:
        digest = hashlib.sha256(task_ref.encode())
        for submitted in files:
            canonical = json.dumps(submitted, sort_keys=True, ensure_ascii=True)
            digest.update(hashlib.sha256(canonical.encode()).digest())
        group_id = f"g{digest.hexdigest()[:12]}"
    planned: list[ExecutionRequest | ExecutionResult] = []
    for index, submitted in enumerate(files):
        sample_id = str(index)
        rid = request_id(group_id, task.task_id, sample_id)
        invalid = None
        if submitted is not None:
            try:
                planned.append(
                    ExecutionRequest(
                        request_id=rid,
                        run_id=group_id,
                        task_ref=task_ref,
                        sample_id=sample_id,
                        files=submitted,
                    )
                )
                continue
            except ValidationError as exc:
                if not written_by_policy(exc):
                    raise InputError(f"completion {index}: {validation_message(exc)}") from None
                # What the completion wrote (an unencodable text, a path outside the
                # workspace): the policy's 0, never the whole group's error.
                invalid = validation_message(exc)
        if invalid is not None:
            planned.append(ungradable(rid, task.task_id, sample_id, invalid))
            continue
        planned.append(
            result_for(
                rid,
                Status.SUCCEEDED,
                scored_reward=0.0,
                feedback=NO_CODE_FEEDBACK,
                flags=[NO_CODE_FLAG],
                task_id=task.task_id,
                sample_id=sample_id,
            )
        )
    return planned
