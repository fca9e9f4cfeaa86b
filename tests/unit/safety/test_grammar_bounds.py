"""Hostile repetition bounds are refused in Python, before llama.cpp's grammar parser expands them."""

from __future__ import annotations

import pytest

from llama_cpp._errors import GrammarError
from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar, json_schema_to_gbnf


@pytest.mark.parametrize(("grammar", "match"), [
    ('root ::= "a"{5,2}', "max 2 < min 5"),
    ('root ::= "a"{0,1000000000}', "expands to 1000000000"),
    ('root ::= ("a"{1000}){1000}', "expand past"),
    ('root ::= item\nitem ::= [a-z]{200000}', "rule 'item'"),
    ('root ::= ' + "(" * 200_000 + '"a"' + ")" * 200_000, "nest more than 256 deep"),
    ("root ::= r0\n" + "".join(f"r{k} ::= r{k + 1}\n" for k in range(10_000)) + 'r10000 ::= "a"\n',
     "more than 8192 rules"),
])
def test_gbnf_bounds(grammar: str, match: str) -> None:
    with pytest.raises(GrammarError, match=match):
        LlamaGrammar.from_string(grammar)


def test_bounds_inside_literals_and_comments_are_ignored() -> None:
    LlamaGrammar.from_string('root ::= "{9999999}" [{}] # {0,99999999}\n')
    LlamaGrammar.from_string(JSON_GBNF)


@pytest.mark.parametrize(("schema", "match"), [
    ({"type": "string", "minLength": 5, "maxLength": 2}, "smaller than minLength"),
    ({"type": "string", "minLength": -1}, "non-negative"),
    ({"type": "string", "maxLength": 10**9}, "expands to"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "smaller than minItems"),
    ({"type": "array", "maxItems": 10**6}, "expands to"),
])
def test_json_schema_bounds(schema: dict, match: str) -> None:
    with pytest.raises(GrammarError, match=match):
        json_schema_to_gbnf(schema)
    with pytest.raises(ValueError, match=match):  # GrammarError stays a ValueError
        LlamaGrammar.from_json_schema(schema)


def test_reasonable_schema_converts() -> None:
    gbnf = json_schema_to_gbnf({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 64}, "tags": {"type": "array", "maxItems": 8}}})
    LlamaGrammar.from_string(gbnf)


def test_deep_but_bounded_nesting_still_parses() -> None:
    LlamaGrammar.from_string("root ::= " + "(" * 200 + '"a"' + ")" * 200)
