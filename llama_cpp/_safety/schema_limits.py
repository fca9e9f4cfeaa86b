"""Checks on a JSON schema before it becomes a grammar: nesting depth, and ``allOf`` branches
whose types cannot all hold (``allOf`` of string and integer made the empty object ``{ }``)."""

from __future__ import annotations

from typing import Any

from .._errors import GrammarError

#: objects and arrays nested inside each other in a schema (real ones: a dozen or so)
MAX_SCHEMA_DEPTH = 64

_JSON_TYPES = frozenset(["string", "integer", "number", "boolean", "null", "object", "array"])


def _value_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _types(schema: Any) -> frozenset[str] | None:
    """The JSON types a (sub)schema allows, when its own keys say so (None: not known here)."""
    if not isinstance(schema, dict):
        return None if schema is not False else frozenset()
    if "const" in schema:
        return frozenset([_value_type(schema["const"])])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(_value_type(v) for v in schema["enum"])
    t = schema.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else None
    if names is None or not all(isinstance(n, str) and n in _JSON_TYPES for n in names):
        return None
    out = set(names)
    if "number" in out:
        out.add("integer")  # an integer is a number
    return frozenset(out)


def _check_all_of(schema: dict[str, Any], path: str) -> None:
    branches = schema["allOf"]
    if not isinstance(branches, list):
        return
    allowed = _types(schema)
    for b in branches:
        t = _types(b)
        if t is not None:
            allowed = t if allowed is None else allowed & t
    if allowed is not None and not allowed:
        raise GrammarError(f"JSON schema at {path or '/'}: allOf combines branches whose types cannot all hold "
                           "(no value satisfies every branch); fix the schema")


def check_schema(schema: Any) -> None:
    """Raise GrammarError for a schema nested deeper than :data:`MAX_SCHEMA_DEPTH` or with an
    unsatisfiable ``allOf``."""
    stack: list[tuple[Any, int, str]] = [(schema, 0, "")]
    seen: set[int] = set()
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels (at {path}); "
                               "flatten it with $defs and $ref")
        if not isinstance(node, dict | list) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if "allOf" in node:
                _check_all_of(node, path)
            stack.extend((v, depth + 1, f"{path}/{k}") for k, v in node.items())
        else:
            stack.extend((v, depth + 1, f"{path}/{i}") for i, v in enumerate(node))
