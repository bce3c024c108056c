"""A deployed stack and the SDK must agree on major.minor: outputs, message shapes and key
layouts may change between minor versions. The stack says its version in an output."""

from __future__ import annotations

import re
import warnings

from trialbox import __version__
from trialbox import constants as c
from trialbox.errors import StackVersionMismatch, UnversionedStackWarning

_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)(?:[.+-]|$)")


def check_stack_version(
    stack_name: str, outputs: dict[str, str], sdk_version: str = __version__
) -> None:
    stack_version = outputs.get(c.OUTPUT_STACK_VERSION)
    if stack_version is None:
        warnings.warn(
            f"stack {stack_name!r} has no {c.OUTPUT_STACK_VERSION} output (deployed by a "
            f"trialbox older than this check), so it cannot be checked against this SDK "
            f"({sdk_version}); redeploy it from this version to be sure they match",
            UnversionedStackWarning,
            stacklevel=4,  # the caller of from_stack (via trialbox.sdk.core.stack_resources)
        )
        return
    if _series(stack_version) != _series(sdk_version):
        raise StackVersionMismatch(
            f"stack {stack_name!r} was deployed by trialbox {stack_version}, but this SDK is "
            f"{sdk_version}: major.minor must match. Install the stack's version "
            f"(pip install 'trialbox=={_series(stack_version)}.*'), or deploy this version's "
            f"stack (npx aws-cdk deploy from a trialbox {_series(sdk_version)} checkout).",
            stack_version,
            sdk_version,
        )


def _series(version: str) -> str:
    """'0.1.3' -> '0.1'; a version that is not major.minor[...] is its own series."""
    match = _MAJOR_MINOR.match(version)
    return f"{match[1]}.{match[2]}" if match else version
