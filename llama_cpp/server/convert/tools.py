"""Function tools as the chat completion path takes them, for every API translated onto it: each API
checks its own tool shape and names its own errors, then builds its chat tools and named tool choices
here (one shape, one default schema)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# a tool without a schema takes no arguments (an object with no properties)
NO_ARGUMENTS: Mapping[str, Any] = {"type": "object", "properties": {}}


def function_tool(name: str, description: str | None, parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A chat tool (``{"type": "function", "function": {...}}``) for function ``name``."""
    fn: dict[str, Any] = {"name": name, "parameters": parameters or dict(NO_ARGUMENTS)}
    if description:
        fn["description"] = description
    return {"type": "function", "function": fn}


def has_tool(tools: list[dict[str, Any]] | None, name: Any) -> bool:
    """Whether chat ``tools`` hold a function named ``name``."""
    return any(t["function"]["name"] == name for t in tools or [])


def named_choice(name: str) -> dict[str, Any]:
    """The chat ``tool_choice`` that forces function ``name``."""
    return {"type": "function", "function": {"name": name}}


__all__ = ["NO_ARGUMENTS", "function_tool", "has_tool", "named_choice"]
