"""Bounds on a chat request's ``tools`` (and upstream's ``functions``) before a template renders them or
their schemas become a grammar: how many, each one's shape and name, the size of their schemas.

Templates paste every tool into the prompt and llama.cpp's chat layer turns each schema into a grammar, so
an unbounded list is unbounded work on the request's path; a malformed entry would otherwise fail deep in
a template or parser without naming the tool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import GrammarError, ParameterError
from .schema_limits import check_schema

#: tools in one request (OpenAI's API allows 128)
MAX_TOOLS = 128
#: a tool's name: the characters a template and llama.cpp's parsers can match (OpenAI's own limit is 64)
MAX_TOOL_NAME_CHARS = 256
#: all tools' definitions together, serialized as JSON
MAX_TOOLS_JSON_BYTES = 1 << 20


def _function(tool: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(tool, Mapping):
        raise ParameterError(f"{where} must be an object, got {type(tool).__name__}")
    if "function" in tool or tool.get("type") == "function":
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ParameterError(f'{where} has type "function" but no "function" object: '
                                 '{"type": "function", "function": {"name": ..., "parameters": {...}}}')
        return fn
    return tool  # upstream's `functions` entries are the function objects themselves


def check_tools(tools: Sequence[Any] | None, field: str = "tools") -> None:
    """Raise :class:`ParameterError` (a ``ValueError``) naming the tool for a list longer than
    :data:`MAX_TOOLS`, larger than :data:`MAX_TOOLS_JSON_BYTES`, a tool without a usable name, or
    parameters that are not a JSON schema object; :class:`GrammarError` for a schema nested too deep
    or unsatisfiable (:func:`~.schema_limits.check_schema`)."""
    if tools is None:
        return
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise ParameterError(f"{field} must be a list of tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise ParameterError(f"{field} lists {len(tools)} tools; at most {MAX_TOOLS} are accepted in one request")
    try:
        size = len(json.dumps(list(tools), ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{field} must hold JSON values only: {exc}") from None
    if size > MAX_TOOLS_JSON_BYTES:
        raise ParameterError(f"{field} take {size} bytes as JSON; at most {MAX_TOOLS_JSON_BYTES} are accepted")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        fn = _function(tool, f"{field}[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME_CHARS \
                or not name.isprintable() or any(c.isspace() for c in name):
            raise ParameterError(f"{field}[{i}] needs a name of 1 to {MAX_TOOL_NAME_CHARS} printable characters "
                                 f"without spaces, got {name!r}")
        if name in names:
            raise ParameterError(f"{field}[{i}]: the tool name {name!r} is used twice; tool names must be unique")
        names.add(name)
        params = fn.get("parameters")
        if params is None:
            continue
        if not isinstance(params, Mapping):
            raise ParameterError(f"tool {name!r}: parameters must be a JSON schema object, got "
                                 f"{type(params).__name__}")
        try:
            check_schema(params)
        except GrammarError as exc:
            raise GrammarError(f"tool {name!r}: {exc}") from None


__all__ = ["MAX_TOOLS", "MAX_TOOLS_JSON_BYTES", "MAX_TOOL_NAME_CHARS", "check_tools"]
