"""One exception root. Each subclass says what went wrong and what to do about it."""


class TrialboxError(Exception):
    """Base of every error Trialbox raises on purpose."""


class InputError(TrialboxError):
    """The caller's input (a task, a sample, a request) is invalid. Fix the input and retry."""


class SandboxError(TrialboxError):
    """The sandbox itself failed (not the code in it). The run carries no reward."""


class SandboxSetupError(SandboxError):
    """The machine is not set up to run sandboxes. The message names the missing piece."""


class StackVersionMismatch(TrialboxError):
    """The stack was deployed by a trialbox whose major.minor differs from this SDK's. The
    message names both versions and what to install or deploy."""

    def __init__(self, message: str, stack_version: str, sdk_version: str) -> None:
        super().__init__(message)
        self.stack_version = stack_version
        self.sdk_version = sdk_version


class UnversionedStackWarning(UserWarning):
    """The stack predates the version output, so its version cannot be checked."""
