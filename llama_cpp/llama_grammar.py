"""GBNF grammars for constrained sampling, and the JSON-schema → GBNF converter.

The grammar text is handed to llama.cpp's native grammar sampler (``llama_sampler_init_grammar``),
which parses it and constrains every sampled token; nothing is matched in Python. JSON schemas
convert with llama.cpp's own converter semantics (:mod:`llama_cpp._json_schema`): integer
ranges, patterns, ``allOf``/``anyOf``/``oneOf``, ``prefixItems``, ``$ref``/``$defs``, string
formats, length and item bounds, ``additionalProperties``; pydantic's ``model_json_schema()``
output converts as is. Repetition bounds are checked before llama.cpp expands them
(:mod:`llama_cpp._grammar_bounds`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._grammar_bounds import check_repetitions
from ._json_schema import schema_to_grammar

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
"""


class LlamaGrammar:
    """A GBNF grammar (text + root rule), as llama-cpp-python's ``LlamaGrammar``.

    ``LlamaGrammar(text)`` and upstream's ``LlamaGrammar(_grammar=text)`` both work; the text is
    checked for a root rule and for repetition bounds here, and parsed by llama.cpp when sampling.
    """

    def __init__(self, grammar: str | None = None, root: str = LLAMA_GRAMMAR_DEFAULT_ROOT, *,
                 _grammar: str | None = None, verbose: bool = False) -> None:
        if grammar is None:
            grammar = _grammar
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("a grammar must be non-empty GBNF text")
        if not re.search(rf"(^|\n)\s*{re.escape(root)}\s*::=", grammar):
            raise ValueError(f"the grammar defines no rule named {root!r} (the start symbol)")
        check_repetitions(grammar)
        self.grammar = grammar
        self.root = root

    @property
    def _grammar(self) -> str:
        return self.grammar

    @property
    def _root(self) -> str:
        return self.root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = False, root: str = LLAMA_GRAMMAR_DEFAULT_ROOT) -> LlamaGrammar:
        return cls(grammar, root)

    @classmethod
    def from_file(cls, file: str | Path, verbose: bool = False) -> LlamaGrammar:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the grammar file {str(file)!r}: {exc.strerror or exc}") from exc
        if not text.strip():
            raise ValueError(f"the grammar file {str(file)!r} is empty")
        return cls(text)

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = False) -> LlamaGrammar:
        return cls(json_schema_to_gbnf(json_schema))

    def __repr__(self) -> str:
        return f"LlamaGrammar(root={self.root!r}, {len(self.grammar)} chars)"


def json_schema_to_gbnf(schema: str | dict[str, Any], prop_order: Sequence[str] | None = None) -> str:
    """Convert a JSON schema (dict or JSON text) to a GBNF grammar whose ``root`` rule matches it.

    ``prop_order`` lists property names to generate first (upstream's argument). Raises
    :class:`~llama_cpp._errors.GrammarError` (a ValueError) for a malformed schema.
    """
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise TypeError("a JSON schema must be an object")
    grammar = schema_to_grammar(schema, prop_order=list(prop_order or ()))
    check_repetitions(grammar)
    return grammar


__all__ = ["JSON_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT", "LlamaGrammar", "json_schema_to_gbnf"]
