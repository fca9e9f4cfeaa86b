"""GBNF grammars for constrained sampling, and the JSON-schema → GBNF converter.

The grammar text is handed to llama.cpp's native grammar sampler (``llama_sampler_init_grammar``),
which parses it and constrains every sampled token; nothing is matched in Python. JSON schemas
convert with llama.cpp's own converter semantics (:mod:`llama_cpp._grammar.json_schema`): integer
ranges, patterns, ``allOf``/``anyOf``/``oneOf``, ``prefixItems``, ``$ref``/``$defs``, string
formats, length and item bounds, ``additionalProperties``; pydantic's ``model_json_schema()``
output converts as is. Repetition bounds are checked before llama.cpp expands them
(:mod:`llama_cpp._safety.grammar_bounds`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import GrammarError
from ._grammar import json_schema as _js
from ._grammar.json_schema import schema_to_grammar
from ._safety.arguments import ArgumentTypeError
from ._safety.grammar_bounds import check_repetitions

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


# llama.cpp's example grammars (vendor/llama.cpp/grammars/*.gbnf), under llama-cpp-python's names
ARITHMETIC_GBNF = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

C_GBNF = r"""
root ::= (declaration)*

declaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"

dataType  ::= "int" ws | "float" ws | "char" ws
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*

parameter ::= dataType identifier

statement ::=
    ( dataType identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" ws expression ";" ) |
    ( "while" "(" condition ")" "{" statement* "}" ) |
    ( "for" "(" forInit ";" ws condition ";" ws forUpdate ")" "{" statement* "}" ) |
    ( "if" "(" condition ")" "{" statement* "}" ("else" "{" statement* "}")? ) |
    ( singleLineComment ) |
    ( multiLineComment )

forInit ::= dataType identifier ws "=" ws expression | identifier ws "=" ws expression
forUpdate ::= identifier ws "=" ws expression

condition ::= expression relationOperator expression
relationOperator ::= ("<=" | "<" | "==" | "!=" | ">=" | ">")

expression ::= term (("+" | "-") term)*
term ::= factor(("*" | "/") factor)*

factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"

argList ::= expression ("," ws expression)*

number ::= [0-9]+

singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"

ws ::= ([ \t\n]+)
"""

CHESS_GBNF = r"""
# Specifies chess moves as a list in algebraic notation, using PGN conventions

# Force first move to "1. ", then any 1-2 digit number after, relying on model to follow the pattern
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?

# piece type, optional file/rank, optional capture, dest file & rank
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]

# optional file & capture, dest file & rank, optional promotion
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?

castle  ::= "O-O" "-O"?
"""

JAPANESE_GBNF = r"""
# A probably incorrect grammar for Japanese
root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
"""

JSON_ARR_GBNF = r"""
# This is the same as json.gbnf but we restrict whitespaces at the end of the root array
# Useful for generating JSON arrays

root   ::= arr
value  ::= object | array | string | number | ("true" | "false" | "null") ws

arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"

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
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [1-9] [0-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

LIST_GBNF = r"""
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
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
            raise GrammarError("a grammar must be non-empty GBNF text")
        if not re.search(rf"(^|\n)\s*{re.escape(root)}\s*::=", grammar):
            raise GrammarError(f"the grammar defines no rule named {root!r} (the start symbol)")
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
            raise GrammarError(f"cannot read the grammar file {str(file)!r}: {exc.strerror or exc}") from exc
        if not text.strip():
            raise GrammarError(f"the grammar file {str(file)!r} is empty")
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
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ArgumentTypeError("a JSON schema must be an object")
    grammar = schema_to_grammar(schema, prop_order=list(prop_order or ()))
    check_repetitions(grammar)
    return grammar


# ---- llama-cpp-python's converter interface ------------------------------------------------------

@dataclass(frozen=True)
class BuiltinRule:
    """A predefined GBNF rule and the rules it uses."""

    content: str
    deps: list[str]


SPACE_RULE = _js.SPACE_RULE
PRIMITIVE_RULES = {k: BuiltinRule(body, list(deps)) for k, (body, deps) in _js.PRIMITIVE_RULES.items()}
STRING_FORMAT_RULES = {k: BuiltinRule(body, list(deps)) for k, (body, deps) in _js.STRING_FORMAT_RULES.items()}
DOTALL = "[\\U00000000-\\U0010FFFF]"
DOT = "[^\\x0A\\x0D]"
RESERVED_NAMES = set(_js.RESERVED_NAMES)
INVALID_RULE_CHARS_RE = _js.INVALID_RULE_CHARS_RE
GRAMMAR_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')
GRAMMAR_LITERAL_ESCAPES = dict(_js.LITERAL_ESCAPES)
NON_LITERAL_SET = set(_js.NON_LITERAL_CHARS)
ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = set(_js.ESCAPED_IN_REGEX_ONLY)


class SchemaConverter:
    """llama-cpp-python's ``SchemaConverter`` interface over this package's converter (llama.cpp's
    semantics): ``visit(schema, name)`` adds the rules, ``format_grammar()`` writes them."""

    def __init__(self, *, prop_order: dict[str, int] | None = None, allow_fetch: bool = False,
                 dotall: bool = False, raw_pattern: bool = False) -> None:
        if allow_fetch:
            raise GrammarError("fetching remote $ref schemas is not supported: put them under $defs and refer "
                             "to them as #/$defs/Name")
        if raw_pattern:
            raise GrammarError("raw_pattern is not supported: patterns convert to JSON string rules")
        self._order = [k for k, _ in sorted((prop_order or {}).items(), key=lambda kv: kv[1])]
        self._converter = _js.Converter(dotall=dotall)

    @property
    def _rules(self) -> dict[str, str]:
        return self._converter.rules

    def _add_rule(self, name: str, rule: str) -> str:
        return self._converter.add_rule(name, rule)

    def resolve_refs(self, schema: dict[str, Any], url: str) -> dict[str, Any]:
        """The schema as given: local ``$ref`` values resolve while visiting."""
        return schema

    def visit(self, schema: dict[str, Any], name: str) -> str:
        return self._converter.visit(_js.parse_schema(schema, self._order), name)

    def format_grammar(self) -> str:
        return self._converter.format_grammar()


__all__ = ["ARITHMETIC_GBNF", "CHESS_GBNF", "C_GBNF", "JAPANESE_GBNF", "JSON_ARR_GBNF", "JSON_GBNF",
           "LIST_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT", "PRIMITIVE_RULES", "SPACE_RULE", "STRING_FORMAT_RULES",
           "BuiltinRule", "LlamaGrammar", "SchemaConverter", "json_schema_to_gbnf"]
