"""One exception root. Each subclass says what went wrong and what to do about it."""


class TrialboxError(Exception):
    """Base of every error Trialbox raises on purpose."""


class InputError(TrialboxError):
    """The caller's input (a task, a sample, a request) is invalid. Fix the input and retry."""


class SandboxError(TrialboxError):
    """The sandbox itself failed (not the code in it). The run carries no reward."""


class SandboxSetupError(SandboxError):
    """The machine is not set up to run sandboxes. The message names the missing piece."""
