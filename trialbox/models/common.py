"""Building blocks shared by every record: strict base model, workspace paths, file contents."""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

MAX_PATH_CHARS = 1024
MAX_FILES = 10_000
DEFAULT_FILE_MODE = 0o644


class StrictModel(BaseModel):
    """Unknown fields are errors: a typo in a task file must not silently change grading."""

    model_config = ConfigDict(extra="forbid")


def refuse_unsupported(raw: Any, unsupported: dict[str, str]) -> Any:
    """A `mode="before"` check: a field that exists in the design but does nothing yet is an
    error saying so, never silently ignored. Named at all (null too) it gets the reason, not
    the generic "Extra inputs are not permitted"."""
    if isinstance(raw, dict):
        for name, reason in unsupported.items():
            if name in raw:
                raise ValueError(f"{name} is not supported yet: {reason}")
    return raw


def _check_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        check_text(json.dumps(value, ensure_ascii=False, default=str), "metadata")
    return value


Metadata = Annotated[
    dict[str, Any] | None,
    AfterValidator(_check_metadata),
    Field(default=None, description="free-form, kept as is"),
]


def _check_relative_path(path: str) -> str:
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"path must be 1 to {MAX_PATH_CHARS} characters")
    if "\x00" in path or "\\" in path:
        raise ValueError(f"path {path!r} contains a NUL or a backslash")
    if path.startswith("/"):
        raise ValueError(f"path {path!r} is absolute; paths are relative to the workspace")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(
            f"path {path!r} has an empty, '.' or '..' component; it must stay inside the workspace"
        )
    if any(len(part.encode()) > 255 for part in parts):
        raise ValueError(f"path {path!r} has a component longer than 255 bytes")
    return path


RelPath = Annotated[str, AfterValidator(_check_relative_path)]


class EncodedFile(StrictModel):
    """A binary or executable file: base64 content and an octal mode such as "0755"."""

    base64: str
    mode: str = "0644"

    @field_validator("mode")
    @classmethod
    def _octal(cls, mode: str) -> str:
        if not re.fullmatch(r"0?[0-7]{3}", mode):
            raise ValueError(
                f'mode {mode!r} is not a permission such as "0644" or "0755" (three octal '
                "digits; setuid, setgid and sticky bits are not allowed)"
            )
        return mode

    @model_validator(mode="after")
    def _decodes(self) -> EncodedFile:
        try:
            base64.b64decode(self.base64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"base64 content does not decode: {exc}") from exc
        return self

    def content(self) -> bytes:
        return base64.b64decode(self.base64)

    def mode_bits(self) -> int:
        return int(self.mode, 8) & 0o777


FileContent = str | EncodedFile


def file_bytes(value: FileContent) -> bytes:
    return value.encode() if isinstance(value, str) else value.content()


def file_mode(value: FileContent) -> int:
    return DEFAULT_FILE_MODE if isinstance(value, str) else value.mode_bits()


def check_text(value: str, what: str) -> str:
    """Text must be encodable as UTF-8: a lone surrogate (say, from a JSON "\\ud83d") cannot
    travel to the sandbox, and is refused here rather than failing later."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} is not valid Unicode text ({exc.reason} at character {exc.start})"
        ) from None
    return value


def _check_files(files: dict[str, FileContent]) -> dict[str, FileContent]:
    if len(files) > MAX_FILES:
        raise ValueError(f"at most {MAX_FILES} files are allowed, got {len(files)}")
    for path, content in files.items():
        check_text(path, f"path {path!r}")
        if isinstance(content, str):
            check_text(content, f"the content of {path}")
    for path in files:
        for parent in PurePosixPath(path).parents:
            if str(parent) != "." and str(parent) in files:
                raise ValueError(f"{parent!s} is a file and also the directory of {path}")
    return files


Files = Annotated[dict[RelPath, FileContent], AfterValidator(_check_files)]

ID_PATTERN = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


def _check_id(value: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise ValueError("must be 1 to 200 characters with no control characters")
    return check_text(value, "the id")


Identifier = Annotated[str, AfterValidator(_check_id)]
