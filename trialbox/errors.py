"""Every exception Trialbox raises on purpose, in one module. Each says what went wrong and
what to do about it."""

from __future__ import annotations

from dataclasses import dataclass


class TrialboxError(Exception):
    """Base of every error Trialbox raises on purpose."""


# --- the caller's input ------------------------------------------------------------------------


class InputError(TrialboxError):
    """The caller's input (a task, a sample, a request) is invalid. Fix the input and retry."""


@dataclass(frozen=True)
class LineError:
    """One problem in an input file: where, which field, and why."""

    file: str
    line: int | None  # None: about the whole file
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class InvalidInputFiles(InputError):
    """tasks.jsonl or samples.jsonl has errors; `errors` lists every one, nothing was run."""

    def __init__(self, errors: list[LineError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {error}" for error in errors)
        where = {(e.file, e.line) for e in errors}
        super().__init__(
            f"{len(errors)} error(s) in {len(where)} place(s); nothing was run:\n{lines}"
        )


class RequestIdReused(InputError):
    """A request id was submitted again with different content. Request ids are idempotency
    keys: the same id with the same content runs once; new content needs a new id."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(
            f"request_id {request_id!r} was already used for a request with different content: "
            "give the new request a new id (the same id with the same content runs once)"
        )


class RequestRejected(TrialboxError):
    """Raised by Prepare: the request cannot run as given; its message says why. (Step
    Functions routes on the class name, `constants.ERROR_REJECTED`.)"""


# --- the SDK's setup and calls -----------------------------------------------------------------


class MissingExtra(TrialboxError):
    """An optional part of Trialbox is used without its extra installed."""

    def __init__(self, what: str, extra: str, module: str | None) -> None:
        self.extra = extra
        missing = f" (no module {module!r})" if module else ""
        super().__init__(f"{what} needs `pip install 'trialbox[{extra}]'`{missing}")


class MissingResources(TrialboxError):
    """No stack outputs and no TRIALBOX_* resource names: nothing says where the pipeline is."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"no Trialbox resources given: set {', '.join(missing)}, or TRIALBOX_STACK=NAME, "
            "use Client.from_stack(NAME), or Client.local()"
        )


class AwsCallError(TrialboxError):
    """AWS refused a call; the message names the call and the reason."""


class WaitTimeout(TrialboxError):
    """Some requests had no terminal result within the timeout; `missing` lists their ids.
    They are still running: wait again, or cancel them."""

    def __init__(self, missing: list[str], timeout_s: float) -> None:
        self.missing = missing
        super().__init__(
            f"{len(missing)} request(s) had no terminal result after {timeout_s:g} s "
            f"(first: {', '.join(missing[:5])})"
        )


class SessionError(TrialboxError):
    """A session cannot go on: no worker took it, it was closed, or its TTL passed."""


class ClientClosed(TrialboxError):
    """The client was closed before this request's result arrived. A request that was sent
    still runs: a new client with the same request gets its result."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(f"the client closed before request {request_id!r} had a result")


class StackVersionMismatch(TrialboxError):
    """The stack was deployed by a trialbox whose major.minor differs from this SDK's. The
    message names both versions and what to install or deploy."""

    def __init__(self, message: str, stack_version: str, sdk_version: str) -> None:
        super().__init__(message)
        self.stack_version = stack_version
        self.sdk_version = sdk_version


class UnversionedStackWarning(UserWarning):
    """The stack predates the version output, so its version cannot be checked."""


# --- the sandbox -------------------------------------------------------------------------------


class SandboxError(TrialboxError):
    """The sandbox itself failed (not the code in it). The run carries no reward."""


class Stopped(SandboxError):
    """Whoever ran the job stopped it (cancelled, or no longer its own): its sandbox was killed
    and it has no result of its own."""


class SandboxSetupError(SandboxError):
    """The machine is not set up to run sandboxes. The message names the missing piece."""
