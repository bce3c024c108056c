"""The SDK's method arguments, each call's read by one model: a bad one is an InputError at
the call naming it (`ttl_s: Input should be less than or equal to 86400`), before anything is
made or sent. The task and the requests have their own reader (trialbox.sdk.inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, Field, StrictInt, ValidationError

from trialbox.errors import InputError
from trialbox.models.common import Files, StrictModel, check_text
from trialbox.models.limits import LimitOverrides
from trialbox.models.sessions import MAX_TTL_S
from trialbox.sdk.inputs import located

M = TypeVar("M", bound=BaseModel)

MAX_FORKS = 100
"""Sessions one `fork` opens at most (each holds a worker's slot)."""

Text = Annotated[str, AfterValidator(lambda v: check_text(v, "the text"))]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def arguments(model: type[M], **values: Any) -> M:
    """The call's arguments read by `model`; InputError naming each bad one."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise InputError(located(exc, "")) from None


class SessionArguments(StrictModel):
    run_id: Text | None = None
    episode_id: Text | None = None
    tags: dict[Text, Text] | None = None
    limits: LimitOverrides | None = None
    ttl_s: float = Field(ge=1, le=MAX_TTL_S, allow_inf_nan=False)
    idle_release_s: Seconds
    files: Files | None = None


class GroupArguments(StrictModel):
    completions: list[Annotated[str, Field(strict=True)]]
    extract: Callable[[str], Any]
    group_id: Text | None = None
    timeout: float | None = None  # NaN or <= 0: an immediate WaitTimeout, as every wait


class ForkArguments(StrictModel):
    n: StrictInt = Field(ge=0, le=MAX_FORKS)


class ReadArguments(StrictModel):
    # Text the worker can be sent; where it leads ("./d/f" is d/f, "../x" leaves the
    # workspace) is the worker's to resolve, without following a link.
    path: Text = Field(min_length=1, max_length=4096)


class ClientArguments(StrictModel):
    concurrency: StrictInt | None = Field(default=None, ge=1)
    endpoint_url: Text | None = None


class PushArguments(StrictModel):
    name: Text = Field(min_length=1, max_length=200)  # a task set's name, in its S3 key
