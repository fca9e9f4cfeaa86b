"""GBNF grammars for constrained sampling, and a JSON-schema → GBNF converter for common schemas.

The grammar text is handed to llama.cpp's native grammar sampler (``llama_sampler_init_grammar``),
which parses it and constrains every sampled token; nothing is matched in Python. The converter
covers the schemas tools and ``response_format`` typically use: objects (required and optional
properties, ``additionalProperties: false`` implied), arrays (``items``, ``minItems``/``maxItems``),
strings (``enum``, ``const``, ``minLength``/``maxLength``), numbers, integers, booleans, null,
``anyOf``/``oneOf``, local ``$ref`` to ``#/$defs`` or ``#/definitions``. Anything else raises
``ValueError`` naming the unsupported keyword rather than silently allowing any JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ._errors import GrammarError
from ._grammar_bounds import check_repetitions

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

_PRIMITIVES = {
    "ws": r'| " " | "\n" [ \t]{0,20}',
    "string": r'"\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws',
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})',
    "number": r'("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws',
    "integer": r'("-"? ([0-9] | [1-9] [0-9]{0,15})) ws',
    "boolean": r'("true" | "false") ws',
    "null": r'"null" ws',
    "value": r'object | array | string | number | ("true" | "false" | "null") ws',
    "object": r'"{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws',
    "array": r'"[" ws ( value ("," ws value)* )? "]" ws',
}
_DEPS = {
    "string": ["ws"], "number": ["ws"], "integer": ["ws"], "boolean": ["ws"], "null": ["ws"],
    "value": ["object", "array", "string", "number", "ws"], "object": ["string", "value", "ws"],
    "array": ["value", "ws"], "char": [], "ws": [],
}


class LlamaGrammar:
    """A GBNF grammar (text + root rule), as llama-cpp-python's ``LlamaGrammar``."""

    def __init__(self, grammar: str, root: str = "root") -> None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("a grammar must be non-empty GBNF text")
        if not re.search(rf"(^|\n)\s*{re.escape(root)}\s*::=", grammar):
            raise ValueError(f"the grammar defines no rule named {root!r} (the start symbol)")
        check_repetitions(grammar)
        self.grammar = grammar
        self.root = root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = False, root: str = "root") -> LlamaGrammar:
        return cls(grammar, root)

    @classmethod
    def from_file(cls, path: str | Path, verbose: bool = False) -> LlamaGrammar:
        return cls(Path(path).read_text(encoding="utf-8"))

    @classmethod
    def from_json_schema(cls, schema: str | dict[str, Any], verbose: bool = False) -> LlamaGrammar:
        return cls(json_schema_to_gbnf(schema))

    def __repr__(self) -> str:
        return f"LlamaGrammar(root={self.root!r}, {len(self.grammar)} chars)"


def _literal(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class _SchemaConverter:
    _SUPPORTED = frozenset({
        "type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "$ref", "$defs",
        "definitions", "additionalProperties", "minItems", "maxItems", "minLength", "maxLength",
        "title", "description", "default", "examples", "$schema", "$id", "format", "nullable",
    })

    def __init__(self, root_schema: dict[str, Any]) -> None:
        self.root_schema = root_schema
        self.rules: dict[str, str] = {}
        self.used: set[str] = set()
        self._refs: dict[str, str] = {}

    def _prim(self, name: str) -> str:
        stack = [name]
        while stack:
            n = stack.pop()
            if n not in self.used:
                self.used.add(n)
                stack.extend(_DEPS[n])
        return name

    def _new_rule(self, hint: str, body: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-") or "r"
        name = base
        k = 1
        while name in self.rules or name in _PRIMITIVES:
            if self.rules.get(name) == body:
                return name
            name = f"{base}-{k}"
            k += 1
        self.rules[name] = body
        return name

    def _resolve_ref(self, ref: str, hint: str) -> str:
        if ref in self._refs:
            return self._refs[ref]
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref values are supported, got {ref!r}")
        node: Any = self.root_schema
        for part in ref[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"$ref {ref!r} does not resolve inside the schema")
            node = node[part]
        name = self._new_rule(ref.rsplit("/", 1)[-1] + "-ref", "")
        self._refs[ref] = name
        self.rules[name] = self.visit(node, name)
        return name

    def visit(self, schema: Any, hint: str) -> str:
        """Return a GBNF expression for ``schema``."""
        if schema is True or schema == {}:
            return self._prim("value")
        if not isinstance(schema, dict):
            raise TypeError(f"unsupported schema node {schema!r}: expected an object or true")
        unknown = set(schema) - self._SUPPORTED
        if unknown:
            raise ValueError(f"JSON-schema keyword(s) not supported by the grammar converter: {sorted(unknown)}")
        if "$ref" in schema:
            return self._resolve_ref(schema["$ref"], hint)
        if "const" in schema:
            return _literal(json.dumps(schema["const"], ensure_ascii=False)) + " " + self._prim("ws")
        if "enum" in schema:
            alts = [_literal(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]]
            if not alts:
                raise ValueError("enum must list at least one value")
            return "(" + " | ".join(alts) + ") " + self._prim("ws")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = [self._new_rule(f"{hint}-{i}", self.visit(s, f"{hint}-{i}"))
                        for i, s in enumerate(schema[key])]
                return "(" + " | ".join(alts) + ")"
        t = schema.get("type")
        if isinstance(t, list):
            alts = [self._new_rule(f"{hint}-{x}", self.visit({**schema, "type": x}, f"{hint}-{x}")) for x in t]
            return "(" + " | ".join(alts) + ")"
        if schema.get("nullable"):
            inner = {k: v for k, v in schema.items() if k != "nullable"}
            return "(" + self._new_rule(hint + "-v", self.visit(inner, hint)) + " | " + self._prim("null") + ")"
        if t == "object" or (t is None and "properties" in schema):
            return self._object(schema, hint)
        if t == "array":
            return self._array(schema, hint)
        if t == "string":
            lo, hi = schema.get("minLength"), schema.get("maxLength")
            if lo is None and hi is None:
                return self._prim("string")
            self._prim("char")
            self._prim("ws")
            lo, hi = _bounds(schema, "minLength", "maxLength")
            rep = f"{{{lo},{hi}}}" if hi is not None else f"{{{lo},}}"
            return f'"\\"" (char){rep} "\\"" ws'
        if t in ("number", "integer", "boolean", "null"):
            return self._prim(t)
        if t is None:
            return self._prim("value")
        raise ValueError(f"unsupported JSON-schema type {t!r}")

    def _object(self, schema: dict[str, Any], hint: str) -> str:
        props: dict[str, Any] = schema.get("properties", {})
        if not props:
            ap = schema.get("additionalProperties", True)
            if ap is False:
                return '"{" ws "}" ' + self._prim("ws")
            return self._prim("object")
        required = set(schema.get("required", []))
        missing = required - set(props)
        if missing:
            raise ValueError(f"required properties {sorted(missing)} are not defined in 'properties'")
        self._prim("ws")
        items = []
        for name, sub in props.items():
            val = self._new_rule(f"{hint}-{name}", self.visit(sub, f"{hint}-{name}"))
            kv = self._new_rule(f"{hint}-{name}-kv", f'{_literal(json.dumps(name))} ws ":" ws {val}')
            items.append((name, kv, name in required))
        # Properties in declaration order; required ones always present, optional ones may be skipped.
        req = [kv for _, kv, r in items if r]
        opt = [kv for _, kv, r in items if not r]
        parts: list[str] = []
        if req:
            parts.append(' "," ws '.join(req))
            for kv in opt:
                parts.append(f'( "," ws {kv} )?')
            body = " ".join(parts)
        else:
            # no required properties: any ordered subset of the optional ones
            alts = []
            for i, kv in enumerate(opt):
                rest = " ".join(f'( "," ws {k} )?' for k in opt[i + 1:])
                alts.append(f"{kv} {rest}".strip())
            body = "( " + " | ".join(alts) + " )?"
        return f'"{{" ws {body} "}}" ws'

    def _array(self, schema: dict[str, Any], hint: str) -> str:
        self._prim("ws")
        item = self._new_rule(f"{hint}-item", self.visit(schema.get("items", True), f"{hint}-item"))
        lo, hi = _bounds(schema, "minItems", "maxItems")
        if hi == 0:
            return '"[" ws "]" ws'
        first_opt = lo == 0
        rest_lo = max(lo - 1, 0)
        rest = f'( "," ws {item} )' + (f"{{{rest_lo},{hi - 1}}}" if hi is not None else f"{{{rest_lo},}}")
        inner = f"{item} {rest}"
        if first_opt:
            inner = f"( {inner} )?"
        return f'"[" ws {inner} "]" ws'

    def grammar(self, schema: dict[str, Any]) -> str:
        root = self.visit(schema, "root")
        lines = [f"root ::= {root}"]
        for name, body in self.rules.items():
            lines.append(f"{name} ::= {body}")
        for name in sorted(self.used):
            lines.append(f"{name} ::= {_PRIMITIVES[name]}")
        return "\n".join(lines) + "\n"


def _bounds(schema: dict[str, Any], lo_key: str, hi_key: str) -> tuple[int, int | None]:
    """``schema``'s (min, max) pair, checked: integers, 0 <= min <= max."""
    lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
    for key, value in ((lo_key, lo), (hi_key, hi)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise GrammarError(f"JSON schema {key} = {value!r}: must be a non-negative integer")
    if hi is not None and hi < lo:
        raise GrammarError(f"JSON schema {hi_key} ({hi}) is smaller than {lo_key} ({lo}); swap or fix them")
    return lo, hi


def json_schema_to_gbnf(schema: str | dict[str, Any]) -> str:
    """Convert a JSON schema (dict or JSON text) to a GBNF grammar whose root matches it."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        raise TypeError("a JSON schema must be an object")
    grammar = _SchemaConverter(schema).grammar(schema)
    check_repetitions(grammar)
    return grammar
