"""What a policy produced for a task (samples.jsonl), and the request that carries it."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from trialbox.models.common import (
    Files,
    Identifier,
    Metadata,
    StrictModel,
    check_text,
    refuse_unsupported,
)
from trialbox.models.limits import LimitOverrides
from trialbox.models.task import Task

MAX_COMMANDS = 64
MAX_ARGV = 4096
# Linux refuses to exec an argument over MAX_ARG_STRLEN (32 pages) with E2BIG, and all of
# them together (with the environment) over ARG_MAX: refused here, never a sandbox failure.
MAX_ARG_BYTES = 128 * 1024 - 1
MAX_ARGV_BYTES = 1024 * 1024


def _check_argv(argv: list[str]) -> list[str]:
    if not argv or not argv[0]:
        raise ValueError("a command is a non-empty list of strings (argv), first the program")
    if len(argv) > MAX_ARGV or any("\x00" in arg for arg in argv):
        raise ValueError(f"a command has at most {MAX_ARGV} arguments and no NUL characters")
    for index, arg in enumerate(argv):
        check_text(arg, f"argument {index}")
    sizes = [len(arg.encode()) for arg in argv]
    if max(sizes) > MAX_ARG_BYTES or sum(sizes) > MAX_ARGV_BYTES:
        raise ValueError(
            f"a command's arguments are at most {MAX_ARG_BYTES} bytes each and "
            f"{MAX_ARGV_BYTES} in all (the kernel's exec limits); put large inputs in files"
        )
    return argv


Argv = Annotated[list[str], AfterValidator(_check_argv)]


class Sample(StrictModel):
    """One line of samples.jsonl: the files a policy wrote, and optional agent-phase commands."""

    schema_version: Literal[1] = 1
    task_id: Identifier
    sample_id: Identifier
    files: Files = Field(default_factory=dict)
    commands: list[Argv] = Field(default_factory=list, max_length=MAX_COMMANDS)
    metadata: Metadata = None


REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def _check_request_id(value: str) -> str:
    if not REQUEST_ID.fullmatch(value):
        raise ValueError(
            "request_id must be 1 to 80 characters of A-Z, a-z, 0-9, '_' or '-' "
            "(it names a Step Functions execution)"
        )
    return value


RequestId = Annotated[str, AfterValidator(_check_request_id)]


class TaskRef(StrictModel):
    """`taskset@version/task_id`: split at the first '@', then at the first '/'."""

    taskset: str
    version: str
    task_id: str

    @classmethod
    def parse(cls, ref: str) -> TaskRef:
        taskset, at, rest = ref.partition("@")
        version, slash, task_id = rest.partition("/")
        if not (at and slash and taskset and version and task_id):
            raise ValueError(f"task ref {ref!r} is not of the form taskset@version/task_id")
        return cls(taskset=taskset, version=version, task_id=task_id)

    def __str__(self) -> str:
        return f"{self.taskset}@{self.version}/{self.task_id}"


EPISODES = (
    "a multi-turn episode is a session (Client.session(episode_id=...)), or requests chained "
    "by base_checkpoint; name the episode and turn in tags"
)
# In the design, not built yet: a request naming one is refused with the reason.
UNSUPPORTED_REQUEST_FIELDS = {
    "priority": "every request runs at normal priority; remove the field",
    "reply_to": "results are read from the executions table (Client.as_completed / gather)",
    "episode_id": EPISODES,
    "turn": EPISODES,
}

CHECKPOINT_PATTERN = r"^[0-9a-f]{64}$"
CheckpointId = Annotated[
    str,
    Field(
        pattern=CHECKPOINT_PATTERN,
        description="a checkpoint: the sha256 of its archive, as a result's `checkpoint` gives it",
    ),
]


class ExecutionRequest(StrictModel):
    """One execution: a task (by reference or inline), the policy's files and commands."""

    schema_version: Literal[1] = 1
    request_id: RequestId
    run_id: str | None = None
    task_ref: str | None = None
    task: Task | None = None
    sample_id: Identifier | None = None
    files: Files = Field(default_factory=dict)
    commands: list[Argv] = Field(default_factory=list, max_length=MAX_COMMANDS)
    grade: bool = True
    base_checkpoint: CheckpointId | None = Field(
        default=None,
        description="start from this workspace: the task's files, then it, then `files`",
    )
    checkpoint: bool = Field(
        default=False,
        description="snapshot the workspace after the commands; the result's `checkpoint` "
        "names it, for a later request's `base_checkpoint`",
    )
    limits: LimitOverrides = Field(default_factory=LimitOverrides)
    tags: dict[str, str] = Field(default_factory=dict)
    metadata: Metadata = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, raw: Any) -> Any:
        return refuse_unsupported(raw, UNSUPPORTED_REQUEST_FIELDS)

    def content_sha256(self) -> str:
        """The request's identity beyond its id: the same id with another hash is a reuse.
        Canonical JSON (sorted keys, defaults left out), so that the SDK and the pipeline agree."""
        canonical = json.dumps(
            self.model_dump(mode="json", exclude_defaults=True),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode(errors="surrogatepass")).hexdigest()

    @property
    def task_id(self) -> str:
        """The task's id, from the inline task or the task ref."""
        if self.task is not None:
            return self.task.task_id
        return TaskRef.parse(self.task_ref or "").task_id

    @model_validator(mode="after")
    def _one_task(self) -> ExecutionRequest:
        if (self.task_ref is None) == (self.task is None):
            raise ValueError("give exactly one of task_ref and task")
        if self.task_ref is not None:
            TaskRef.parse(self.task_ref)
        return self


def written_by_policy(exc: ValidationError) -> bool:
    """Whether every error is in what the policy wrote: a file's path or text (a path out of
    the workspace, text that is not valid Unicode), or its commands (how many, how long, their
    words). Not the shape of the record, which the trainer's code builds: a wrong type, a file
    mode or an encoding stays its error."""
    policy = ("value_error", "too_long", "string_too_long")

    def policy_part(loc: tuple[int | str, ...]) -> bool:
        in_files = loc == ("files",) or (loc[0] == "files" and loc[-1] == "[key]")
        return in_files or loc[0] == "commands"

    return all(e["type"] in policy and policy_part(e["loc"]) for e in exc.errors())
