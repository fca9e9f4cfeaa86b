"""Bounds on a request's tools: count, size, names, schemas, each refusal naming the tool."""

from __future__ import annotations

import pytest

from llama_cpp._errors import GrammarError, ParameterError
from llama_cpp._safety.tool_limits import MAX_TOOLS, MAX_TOOLS_JSON_BYTES, check_tools


def tool(name: str = "get_unit", params: object = None) -> dict:
    fn: dict = {"name": name, "description": "d"}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


def test_real_tools_pass() -> None:
    check_tools(None)
    check_tools([tool(params={"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}}), tool("other")])
    check_tools([{"name": "legacy", "parameters": {"type": "object"}}], "functions")  # upstream's functions


@pytest.mark.parametrize("tools, match", [
    ([tool(str(i)) for i in range(MAX_TOOLS + 1)], f"at most {MAX_TOOLS}"),
    ([tool(params={"type": "object", "description": "x" * MAX_TOOLS_JSON_BYTES})], "bytes as JSON"),
    ([tool("")], r"tools\[0\] needs a name"),
    ([tool("has space")], "needs a name"),
    ([tool("a"), tool("a")], "used twice"),
    ([tool(params=["not", "a", "schema"])], "tool 'get_unit': parameters must be a JSON schema object"),
    ([{"type": "function"}], 'no "function" object'),
    (["get_unit"], r"tools\[0\] must be an object"),
    ("get_unit", "must be a list"),
])
def test_bad_tools_are_refused_naming_the_problem(tools, match) -> None:
    with pytest.raises(ParameterError, match=match):
        check_tools(tools)


def test_a_schema_too_deep_names_its_tool() -> None:
    deep: dict = {"type": "object"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(GrammarError, match="tool 'nested'"):
        check_tools([tool("nested", deep)])
