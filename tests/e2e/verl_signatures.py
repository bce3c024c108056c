"""verl 0.9.1's tool interface by its copied signatures: verl imports torch and ray, so
`make test` (tests/e2e/test_integrations.py) and the overhead benchmark put these in
`sys.modules` in its place. `make integration-smoke` runs against verl itself."""

from __future__ import annotations

import types
from typing import Any

import pydantic


class _Schema(pydantic.BaseModel):
    """verl.tools.schemas.OpenAIFunctionToolSchema's shape (verl 0.9.1, schemas.py:52)."""

    type: str
    function: dict[str, Any]


class _ToolResponse(pydantic.BaseModel):
    """verl.tools.schemas.ToolResponse (verl 0.9.1, schemas.py:98)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class _BaseTool:
    """verl.tools.base_tool.BaseTool's constructor (verl 0.9.1, base_tool.py:36): verl imports
    torch and ray, so the tool is tested against these copied signatures."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = self.tool_schema.function["name"]

    def get_openai_tool_schema(self) -> Any:
        raise NotImplementedError


def modules() -> dict[str, types.ModuleType]:
    """The modules TrialboxTool imports, by name, holding the copies above."""
    base = types.ModuleType("verl.tools.base_tool")
    base.BaseTool = _BaseTool  # type: ignore[attr-defined]
    schemas = types.ModuleType("verl.tools.schemas")
    schemas.ToolResponse = _ToolResponse  # type: ignore[attr-defined]
    schemas.OpenAIFunctionToolSchema = _Schema  # type: ignore[attr-defined]
    return {
        "verl": types.ModuleType("verl"),
        "verl.tools": types.ModuleType("verl.tools"),
        "verl.tools.base_tool": base,
        "verl.tools.schemas": schemas,
    }
