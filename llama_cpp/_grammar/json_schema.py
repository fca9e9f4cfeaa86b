"""JSON schema → GBNF with the semantics of llama.cpp's ``json-schema-to-grammar`` (common/).

Two steps, as llama.cpp does them: :func:`parse_schema` reads the JSON schema into a small tree of
:class:`Node` kinds (the same decisions as ``common/json-schema.cpp``: which keyword wins, how a
type list becomes an alternative, how fractional integer bounds round inwards), and
:class:`Converter` writes each node as GBNF rules (``common/json-schema-to-grammar.cpp``: integer
ranges as digit alternatives, anchored regular-expression patterns, ``allOf`` merged into one
object, ``additionalProperties`` keys that exclude the declared names). Keywords that constrain
nothing llama.cpp enforces (``uniqueItems``, ``title``, ``description``, number bounds …) are
accepted and ignored, so every schema llama.cpp accepts converts here too.

A pattern llama.cpp cannot express (lookarounds, unanchored) falls back to any string with a
logged warning, as llama.cpp's converter does; malformed schemas raise
:class:`~llama_cpp._errors.GrammarError` naming the JSON pointer and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from .._errors import GrammarError
from .._safety.schema_limits import check_schema

logger = logging.getLogger("llama_cpp.grammar")

SPACE_RULE = r'| " " | "\n"{1,2} [ \t]{0,20}'

# name: (body, dependencies)
PRIMITIVE_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": (r'"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} '
             r'"-" [0-9a-fA-F]{12} "\""', ()),
    "char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": (r'"\"" char* "\""', ("char",)),
    "null": ('"null"', ()),
}

STRING_FORMAT_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": (r'"\"" date "\""', ("date",)),
    "time-string": (r'"\"" time "\""', ("time",)),
    "date-time-string": (r'"\"" date-time "\""', ("date-time",)),
}

#: rule names a schema's own names must not take (a clash gets a ``-`` suffix)
RESERVED_NAMES = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})
#: the characters a GBNF rule name cannot hold (each run becomes ``-``)
INVALID_RULE_CHARS_RE = re.compile(r"[^a-zA-Z0-9-]+")
#: the escapes inside a quoted GBNF literal
LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_CLASS_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\", "]": "\\]", "-": "\\-", "^": "\\^"}
#: the regular-expression characters that end a run of literal characters in a ``pattern``
NON_LITERAL_CHARS = frozenset("|.()[]{}*+?^$")
#: the characters a ``pattern`` escapes with a backslash that a GBNF literal takes as they are
ESCAPED_IN_REGEX_ONLY = frozenset("^$.[]()|{}*+?")
_MAX_PATTERN_DEPTH = 100


def format_literal(text: str) -> str:
    """``text`` as a quoted GBNF literal."""
    return '"' + "".join(LITERAL_ESCAPES.get(c, c) for c in text) + '"'


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# schema → node tree
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Node:
    """One schema node, by ``kind``: any, ref, anyOf, allOf, const, enum, null, boolean, number,
    integer, string, array, tuple, object."""

    kind: str
    children: list[Node] = dataclasses.field(default_factory=list)
    value: Any = None
    values: list[Any] = dataclasses.field(default_factory=list)
    properties: list[tuple[str, Node, bool]] = dataclasses.field(default_factory=list)
    additional: Node | None = None
    items: Node | None = None
    min_items: int = 0
    max_items: int | None = None
    pattern: str | None = None
    fmt: str | None = None
    min_length: int = 0
    max_length: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    ref: str = ""
    target: Node | None = None


def _fail(path: str, message: str) -> None:
    raise GrammarError(f"JSON schema error at {path}: {message}")


def _count(schema: dict[str, Any], key: str, path: str) -> int | None:
    if key not in schema:
        return None
    v = schema[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GrammarError(f"JSON schema {key} = {v!r} at {path}: must be a non-negative integer")
    return v


def _bound(schema: dict[str, Any], key: str, path: str, round_up: bool) -> int:
    v = schema[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        _fail(path, f"{key} must be a finite number, got {v!r}")
    if isinstance(v, int):
        return v
    return int(math.ceil(v) if round_up else math.floor(v))


def _format(schema: dict[str, Any], path: str) -> str | None:
    if "format" not in schema:
        return None
    f = schema["format"]
    if not isinstance(f, str):
        _fail(path, "format must be a string")
    if f in ("date", "time", "date-time"):
        return f
    if f == "uuid" or re.fullmatch(r"uuid[1-5]", f):
        return "uuid"
    return None


class _Parser:
    def __init__(self, root: dict[str, Any], prop_order: dict[str, int] | None = None) -> None:
        self.root = root
        self.prop_order = prop_order or {}
        self.refs: dict[str, Node | None] = {}
        self.pending: list[Node] = []

    def parse(self) -> Node:
        node = self.node(self.root, "#")
        for ref_node in self.pending:
            ref_node.target = self.refs[ref_node.ref]
        return node

    def _resolve(self, ref: str, path: str) -> Any:
        target: Any = self.root
        for sel in ref[2:].split("/"):
            sel = sel.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list) and sel.isdigit() and int(sel) < len(target):
                target = target[int(sel)]
            else:
                _fail(path, f"cannot resolve $ref {ref}: {sel!r} not found; point it at a definition "
                            "in the same schema (for example #/$defs/Name)")
        return target

    def _ref(self, value: Any, path: str) -> Node:
        if not isinstance(value, str):
            _fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            _fail(path, f"unsupported $ref {value}: only references into the same document (#/...) are supported")
        if value not in self.refs:
            self.refs[value] = None  # reserved first: a cycle back to this $ref stops here
            self.refs[value] = self.node(self._resolve(value, path), value)
        node = Node("ref", ref=value)
        self.pending.append(node)
        return node

    def _alternatives(self, kind: str, alts: Any, path: str) -> Node:
        if not isinstance(alts, list):
            _fail(path, "must be an array of schemas")
        if not alts:
            _fail(path, "must not be empty")
        return Node(kind, children=[self.node(a, f"{path}/{i}") for i, a in enumerate(alts)])

    def _object(self, schema: dict[str, Any], path: str) -> Node:
        node = Node("object")
        req = schema.get("required")
        required = {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, dict):
                _fail(path, "properties must be an object")
            names = sorted(props, key=lambda k: self.prop_order.get(k, len(self.prop_order)))
            node.properties = [(name, self.node(props[name], f"{path}/properties/{name}"), name in required)
                               for name in names]
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if extra is True:
                node.additional = Node("any")
            elif isinstance(extra, dict):
                node.additional = self.node(extra, f"{path}/additionalProperties")
            elif extra is not False:
                _fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional = Node("any")  # {"type": "object"} alone accepts any object
        return node

    def _array(self, schema: dict[str, Any], path: str) -> Node:
        node = Node("array")
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                return Node("tuple", children=[self.node(s, f"{path}/{key}/{i}") for i, s in enumerate(items)])
            node.items = self.node(items, f"{path}/{key}")
        else:
            node.items = Node("any")
        node.min_items = _count(schema, "minItems", path) or 0
        node.max_items = _count(schema, "maxItems", path)
        _check_order(node.min_items, node.max_items, "minItems", "maxItems")
        return node

    def _string(self, schema: dict[str, Any], path: str) -> Node:
        node = Node("string")
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                _fail(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.fmt = _format(schema, path)
        node.min_length = _count(schema, "minLength", path) or 0
        node.max_length = _count(schema, "maxLength", path)
        _check_order(node.min_length, node.max_length, "minLength", "maxLength")
        return node

    def _integer(self, schema: dict[str, Any], path: str) -> Node:
        node = Node("integer")
        if "minimum" in schema:
            node.minimum = _bound(schema, "minimum", path, round_up=True)
        elif "exclusiveMinimum" in schema and not isinstance(schema["exclusiveMinimum"], bool):
            node.minimum = _bound(schema, "exclusiveMinimum", path, round_up=False) + 1
        if "maximum" in schema:
            node.maximum = _bound(schema, "maximum", path, round_up=False)
        elif "exclusiveMaximum" in schema and not isinstance(schema["exclusiveMaximum"], bool):
            node.maximum = _bound(schema, "exclusiveMaximum", path, round_up=True) - 1
        if node.minimum is not None and node.maximum is not None and node.maximum < node.minimum:
            raise GrammarError(f"JSON schema at {path}: maximum ({node.maximum}) is smaller than minimum "
                               f"({node.minimum}); no integer fits, swap or fix them")
        return node

    def node(self, schema: Any, path: str) -> Node:
        if schema is True:
            return Node("any")
        if not isinstance(schema, dict):
            _fail(path, f"a schema must be an object, got {type(schema).__name__}")
        if "$ref" in schema:
            return self._ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self._alternatives("anyOf", schema[key], f"{path}/{key}")
        t = schema.get("type")
        if isinstance(t, list):
            if not t:
                _fail(path, "type must not be empty")
            return Node("anyOf", children=[self.node({**schema, "type": x}, f"{path}/type/{i}")
                                           for i, x in enumerate(t)])
        if "const" in schema:
            return Node("const", value=schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                _fail(path, "enum must be a non-empty array")
            return Node("enum", values=list(values))
        if t is not None and not isinstance(t, str):
            _fail(path, "type must be a string or an array of strings")
        if schema.get("nullable") is True and t is not None and t != "null":
            # OpenAPI's nullable: the type or null
            inner = {k: v for k, v in schema.items() if k != "nullable"}
            return Node("anyOf", children=[self.node(inner, path), Node("null")])
        has_props = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True)
        if t is None:
            if has_props:
                return self._object(schema, path)
            if "allOf" in schema:
                return self._alternatives("allOf", schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self._array(schema, path)
            if ("pattern" in schema or "minLength" in schema or "maxLength" in schema
                    or _format(schema, path) is not None):
                return self._string(schema, path)
            return Node("any")
        if t == "object":
            if not has_props and "allOf" in schema:
                return self._alternatives("allOf", schema["allOf"], f"{path}/allOf")
            return self._object(schema, path)
        if t == "string":
            if "allOf" in schema:
                return self._alternatives("allOf", schema["allOf"], f"{path}/allOf")
            return self._string(schema, path)
        if t == "array":
            return self._array(schema, path)
        if t == "integer":
            return self._integer(schema, path)
        if t in ("number", "boolean", "null"):
            return Node(t)
        _fail(path, f"unrecognized type {t!r}; use one of object, array, string, number, integer, boolean, null")
        raise AssertionError  # unreachable


def _check_order(lo: int, hi: int | None, lo_key: str, hi_key: str) -> None:
    if hi is not None and hi < lo:
        raise GrammarError(f"JSON schema {hi_key} ({hi}) is smaller than {lo_key} ({lo}); swap or fix them")


def parse_schema(schema: dict[str, Any], prop_order: Sequence[str] = ()) -> Node:
    """The node tree of ``schema`` (its ``$ref`` targets linked); ``prop_order`` names properties
    to emit first, in that order (the rest keep their declaration order)."""
    return _Parser(schema, {name: i for i, name in enumerate(prop_order)}).parse()


# --------------------------------------------------------------------------------------------
# node tree → GBNF
# --------------------------------------------------------------------------------------------

def build_repetition(item: str, lo: int, hi: int | None, separator: str = "") -> str:
    """``item`` repeated ``lo``..``hi`` times (``hi`` None: unbounded), optionally separated."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return item + "?"
    if not separator:
        if lo == 1 and hi is None:
            return item + "+"
        if lo == 0 and hi is None:
            return item + "*"
        return f"{item}{{{lo},{'' if hi is None else hi}}}"
    rest = build_repetition(f"({separator} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    out = f"{item} {rest}"
    return f"({out})?" if lo == 0 else out


def _digits(lo: int, hi: int | None) -> str:
    if lo == hi == 1:
        return "[0-9]"
    if lo == hi:
        return f"[0-9]{{{lo}}}"
    return f"[0-9]{{{lo},{'' if hi is None else hi}}}"


def _drange(a: str, b: str) -> str:
    return f"[{a}]" if a == b else f"[{a}-{b}]"


def _uniform_range(lo: str, hi: str) -> str:
    """Digit strings of equal length from ``lo`` to ``hi``, as GBNF."""
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    out = [f'"{lo[:i]}"'] if i else []
    if i < len(lo) and i < len(hi):
        n = len(lo) - i - 1
        if n == 0:
            out.append(f"[{lo[i]}-{hi[i]}]")
        else:
            lo_sub, hi_sub = lo[i + 1:], hi[i + 1:]
            zeros, nines = "0" * n, "9" * n
            alts = []
            reached = False
            if lo_sub == zeros:
                alts.append(f"{_drange(lo[i], chr(ord(hi[i]) - 1))} {_digits(n, n)}")
            else:
                alts.append(f"[{lo[i]}] ({_uniform_range(lo_sub, nines)})")
                if ord(lo[i]) < ord(hi[i]) - 1:
                    if hi_sub == nines:
                        alts.append(f"{_drange(chr(ord(lo[i]) + 1), hi[i])} {_digits(n, n)}")
                        reached = True
                    else:
                        alts.append(f"{_drange(chr(ord(lo[i]) + 1), chr(ord(hi[i]) - 1))} {_digits(n, n)}")
            if not reached:
                alts.append(f"{_drange(hi[i], hi[i])} {_uniform_range(zeros, hi_sub)}")
            out.append("(" + " | ".join(alts) + ")")
    return " ".join(out)


def int_range(lo: int | None, hi: int | None, decimals: int = 16, top: bool = True) -> str:
    """GBNF for the decimal integers in [lo, hi] (None: unbounded on that side), as llama.cpp."""
    if lo is not None and hi is not None:
        if lo < 0 and hi < 0:
            return f'"-" ({int_range(-hi, -lo, decimals)})'
        prefix = ""
        if lo < 0:
            prefix = f'"-" ({int_range(0, -lo, decimals)}) | '
            lo = 0
        lo_s, hi_s = str(lo), str(hi)
        parts = []
        for width in range(len(lo_s), len(hi_s)):
            parts.append(_uniform_range(lo_s, "9" * width))
            lo_s = "1" + "0" * width
        parts.append(_uniform_range(lo_s, hi_s))
        return prefix + " | ".join(parts)
    fewer = max(decimals - 1, 1)
    if lo is not None:
        if lo < 0:
            return f'"-" ({int_range(None, -lo, decimals, top=False)}) | [0] | [1-9] {_digits(0, decimals - 1)}'
        if lo == 0:
            return f"[0] | [1-9] {_digits(0, fewer)}" if top else _digits(1, decimals)
        if lo <= 9:
            c = str(lo)
            start = "1" if top else "0"
            out = f"{_drange(start, chr(ord(c) - 1))} {_digits(1, fewer)} | " if c > start else ""
            return out + f"{_drange(c, '9')} {_digits(0, fewer)}"
        s = str(lo)
        c = s[0]
        out = f"{_drange('1' if top else '0', chr(ord(c) - 1))} {_digits(len(s), fewer)} | " if c > "1" else ""
        out += f"{_drange(c, c)} ({int_range(int(s[1:]), None, fewer, top=False)})"
        if c < "9":
            out += f" | {_drange(chr(ord(c) + 1), '9')} {_digits(len(s) - 1, fewer)}"
        return out
    if hi is not None:
        if hi >= 0:
            neg = f'"-" [1-9] {_digits(0, fewer)} | ' if top else ""
            return neg + int_range(0, hi, decimals)
        return f'"-" ({int_range(-hi, None, decimals, top=False)})'
    raise ValueError("int_range needs at least one bound")


class _UnsupportedPattern(Exception):
    pass


def _escape_length(p: str, i: int) -> int:
    """Length of a GBNF-compatible escape at ``p[i]`` (0 if none), as llama.cpp's parser reads them."""
    if i + 1 >= len(p) or p[i] != "\\":
        return 0
    nxt = p[i + 1]
    if nxt in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(nxt)
    if n_hex is None or i + 2 + n_hex > len(p):
        return 0
    if not all(h in "0123456789abcdefABCDEF" for h in p[i + 2:i + 2 + n_hex]):
        return 0
    return 2 + n_hex


class Converter:
    """Writes a node tree as GBNF rules (``rules``), named and deduplicated as llama.cpp does."""

    def __init__(self, dotall: bool = False) -> None:
        self.dotall = dotall
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self._resolving: set[str] = set()

    def add_rule(self, name: str, body: str) -> str:
        key = INVALID_RULE_CHARS_RE.sub("-", name)
        if key not in self.rules or self.rules[key] == body:
            self.rules[key] = body
            return key
        i = 0
        while f"{key}{i}" in self.rules and self.rules[f"{key}{i}"] != body:
            i += 1
        self.rules[f"{key}{i}"] = body
        return f"{key}{i}"

    def _primitive(self, name: str, table: dict[str, tuple[str, tuple[str, ...]]] = PRIMITIVE_RULES) -> str:
        body, deps = table[name]
        out = self.add_rule(name, body)
        for dep in deps:
            if dep not in self.rules:
                self._primitive(dep, PRIMITIVE_RULES if dep in PRIMITIVE_RULES else STRING_FORMAT_RULES)
        return out

    def _visit_primitive(self, rule_name: str, kind: str) -> str:
        body, deps = PRIMITIVE_RULES[kind]
        name = self.add_rule("root" if rule_name == "root" else kind, body)
        for dep in deps:
            if dep not in self.rules:
                self._primitive(dep)
        return name

    # ---- patterns ---------------------------------------------------------------------------

    def _visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return self._pattern_to_rule(pattern, name)
        except _UnsupportedPattern as exc:
            self.rules = snapshot
            logger.warning("JSON schema pattern %r is not supported (%s); accepting any string", pattern, exc)
            return self.add_rule(name, self._primitive("string"))

    def _pattern_to_rule(self, pattern: str, name: str) -> str:
        if len(pattern) < 2 or not pattern.startswith("^") or not pattern.endswith("$"):
            raise _UnsupportedPattern("not anchored with '^' and '$'")
        sub = pattern[1:-1]
        n = len(sub)
        pos = 0
        depth = 0
        sub_ids: dict[str, str] = {}

        def as_rule(item: tuple[str, bool]) -> str:
            return f'"{item[0]}"' if item[1] else item[0]

        def join(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
            merged: list[tuple[str, bool]] = []
            for text, lit in seq:
                if lit and merged and merged[-1][1]:
                    merged[-1] = (merged[-1][0] + text, True)
                else:
                    merged.append((text, lit))
            return " ".join(as_rule(m) for m in merged), False

        def transform() -> tuple[str, bool]:
            nonlocal pos, depth
            seq: list[tuple[str, bool]] = []
            while pos < n:
                c = sub[pos]
                if c == ".":
                    seq.append((self.add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.dotall else "[^\\x0A\\x0D]"),
                                False))
                    pos += 1
                elif c == "(":
                    pos += 1
                    if pos < n and sub[pos] == "?":
                        if pos + 1 < n and sub[pos + 1] == ":":
                            pos += 2
                        else:
                            raise _UnsupportedPattern("unsupported group syntax")
                    depth += 1
                    if depth > _MAX_PATTERN_DEPTH:
                        raise _UnsupportedPattern("pattern nesting too deep")
                    seq.append(("(" + as_rule(transform()) + ")", False))
                elif c == ")":
                    pos += 1
                    if depth == 0:
                        raise GrammarError(f"invalid JSON schema pattern {pattern!r}: unbalanced parentheses")
                    depth -= 1
                    return join(seq)
                elif c in "^$":
                    raise _UnsupportedPattern("anchor inside the pattern")
                elif c == "[":
                    cls = "["
                    pos += 1
                    while pos < n and sub[pos] != "]":
                        if sub[pos] == "\\":
                            k = _escape_length(sub, pos)
                            if k == 0:
                                raise _UnsupportedPattern(f"unsupported escape in character class: {sub[pos:pos + 2]}")
                            cls += sub[pos:pos + k]
                            pos += k
                        else:
                            cls += sub[pos]
                            pos += 1
                    if pos >= n:
                        raise GrammarError(f"invalid JSON schema pattern {pattern!r}: unterminated character class")
                    seq.append((cls + "]", False))
                    pos += 1
                elif c == "|":
                    seq.append(("|", False))
                    pos += 1
                elif c in "*+?":
                    if not seq:
                        raise GrammarError(f"invalid JSON schema pattern {pattern!r}: nothing to repeat")
                    seq[-1] = (as_rule(seq[-1]) + c, False)
                    pos += 1
                elif c == "{":
                    end = sub.find("}", pos)
                    if end < 0:
                        raise _UnsupportedPattern("unterminated curly brackets")
                    nums = sub[pos + 1:end].split(",")
                    pos = end + 1
                    if len(nums) not in (1, 2):
                        raise _UnsupportedPattern("wrong number of values in curly brackets")
                    try:
                        if len(nums) == 1:
                            lo = hi = int(nums[0])
                        else:
                            lo = int(nums[0]) if nums[0].strip() else 0
                            hi = int(nums[1]) if nums[1].strip() else None
                    except ValueError:
                        raise _UnsupportedPattern("invalid number in curly brackets") from None
                    if not seq:
                        raise GrammarError(f"invalid JSON schema pattern {pattern!r}: nothing to repeat")
                    text, lit = seq[-1]
                    if not lit:
                        if text not in sub_ids:
                            sub_ids[text] = self.add_rule(f"{name}-{len(sub_ids) + 1}", text)
                        text = sub_ids[text]
                    seq[-1] = (build_repetition(f'"{text}"' if lit else text, lo, hi), False)
                else:
                    literal = ""
                    while pos < n:
                        ch = sub[pos]
                        if ch == "\\":
                            if pos == n - 1:
                                raise GrammarError(f"invalid JSON schema pattern {pattern!r}: trailing backslash")
                            nxt = sub[pos + 1]
                            if nxt in ESCAPED_IN_REGEX_ONLY:
                                literal += LITERAL_ESCAPES.get(nxt, nxt)
                                pos += 2
                            else:
                                k = _escape_length(sub, pos)
                                if k == 0:
                                    raise _UnsupportedPattern(f"unsupported escape: {sub[pos:pos + 2]}")
                                literal += sub[pos:pos + k]
                                pos += k
                        elif ch == '"':
                            literal += '\\"'
                            pos += 1
                        elif ch not in NON_LITERAL_CHARS and (pos == n - 1 or not literal or sub[pos + 1] == "."
                                                              or sub[pos + 1] not in NON_LITERAL_CHARS):
                            literal += LITERAL_ESCAPES.get(ch, ch)
                            pos += 1
                        else:
                            break
                    if not literal:
                        raise _UnsupportedPattern(f"unsupported character: {c}")
                    seq.append((literal, True))
            return join(seq)

        rule = as_rule(transform())
        if depth != 0:
            raise GrammarError(f"invalid JSON schema pattern {pattern!r}: unbalanced parentheses")
        return self.add_rule(name, f'"\\"" ({rule}) "\\""')

    # ---- objects ----------------------------------------------------------------------------

    def _not_strings(self, names: list[str]) -> str:
        """A JSON string that is none of ``names`` (the additionalProperties key rule)."""
        trie: dict[str, Any] = {}
        for word in names:
            node = trie
            for ch in word:
                node = node.setdefault(ch, {})
            node[""] = {}
        char = self._primitive("char")

        def esc(ch: str) -> str:
            return _CLASS_ESCAPES.get(ch, ch)

        def walk(node: dict[str, Any]) -> str:
            kids = sorted(k for k in node if k)
            alts = []
            for ch in kids:
                child = node[ch]
                if any(k for k in child):
                    alts.append(f"[{esc(ch)}] ({walk(child)})")
                else:
                    alts.append(f"[{esc(ch)}] {char}+")
            if kids:
                alts.append(f'[^"{"".join(esc(k) for k in kids)}] {char}*')
            return " | ".join(alts)

        body = walk(trie)
        optional = "" if "" in trie else "?"
        return f'["] ( {body} ){optional} ["]'

    def _object_rule(self, properties: list[tuple[str, Node]], required: set[str], name: str,
                     additional: Node | None) -> str:
        sep = "-" if name else ""
        req: list[str] = []
        opt: list[str] = []
        kv: dict[str, str] = {}
        names: list[str] = []
        for prop, sub in properties:
            value = self.visit(sub, f"{name}{sep}{prop}")
            kv[prop] = self.add_rule(f"{name}{sep}{prop}-kv",
                                     f'{format_literal(_json_text(prop))} space ":" space {value}')
            (req if prop in required else opt).append(prop)
            names.append(prop)
        if additional is not None:
            sub_name = f"{name}{sep}additional"
            value = (self.visit(additional, f"{sub_name}-value") if additional.kind != "any"
                     else self._primitive("value"))
            key = self.add_rule(f"{sub_name}-k", self._not_strings(names)) if names else self._primitive("string")
            kv["*"] = self.add_rule(f"{sub_name}-kv", f'{key} ":" space {value}')
            opt.append("*")
        if not req and not opt:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[p] for p in req)
        if opt:
            def chain(keys: list[str], first_optional: bool) -> str:
                k, rest = keys[0], keys[1:]
                comma = f'( "," space {kv[k]} )'
                if first_optional:
                    res = comma + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (f" {comma}*" if k == "*" else "")
                if rest:
                    res += " " + self.add_rule(f"{name}{sep}{k}-rest", chain(rest, True))
                return res

            rule += " ("
            if req:
                rule += ' "," space ( '
            rule += " | ".join(chain(opt[i:], False) for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def _all_of(self, node: Node, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, Node]] = []
        enum_counts: dict[str, int] = {}

        def add(comp: Node, is_required: bool) -> None:
            if comp.kind == "ref":
                if comp.target is not None:
                    add(comp.target, is_required)
            elif comp.kind == "object":
                for prop, sub, _ in comp.properties:
                    properties.append((prop, sub))
                    if is_required:
                        required.add(prop)
            elif comp.kind == "enum":
                for v in comp.values:
                    lit = format_literal(_json_text(v))
                    enum_counts[lit] = enum_counts.get(lit, 0) + 1

        for child in node.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add(alt, False)
            else:
                add(child, True)
        common = sorted(lit for lit, k in enum_counts.items() if k == len(node.children))
        if common:
            return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self._object_rule(properties, required, name, None))

    def _resolve_ref(self, node: Node) -> str:
        fragment = node.ref.split("#", 1)[1] if "#" in node.ref else node.ref
        ref_name = "ref" + INVALID_RULE_CHARS_RE.sub("-", fragment)
        if ref_name not in self.rules and node.ref not in self._resolving:
            if node.target is None:
                raise GrammarError(f"JSON schema: unresolved $ref {node.ref}")
            self._resolving.add(node.ref)
            ref_name = self.visit(node.target, ref_name)
            self._resolving.discard(node.ref)
        return ref_name

    # ---- dispatch ---------------------------------------------------------------------------

    def visit(self, node: Node, name: str) -> str:
        """The rule name matching ``node`` (``name`` "" is the root)."""
        rule_name = f"{name}-" if name in RESERVED_NAMES else (name or "root")
        sub_name = f"{name}-" if name else ""
        kind = node.kind
        if kind == "ref":
            return self.add_rule(rule_name, self._resolve_ref(node))
        if kind == "anyOf":
            alts = [self.visit(c, f"{name}{'-' if name else 'alternative-'}{i}") for i, c in enumerate(node.children)]
            return self.add_rule(rule_name, " | ".join(alts))
        if kind == "allOf":
            return self._all_of(node, name, rule_name)
        if kind == "const":
            return self.add_rule(rule_name, format_literal(_json_text(node.value)))
        if kind == "enum":
            return self.add_rule(rule_name, "(" + " | ".join(format_literal(_json_text(v)) for v in node.values) + ")")
        if kind == "object":
            if not node.properties and node.additional is not None and node.additional.kind == "any":
                return self.add_rule(rule_name, self._primitive("object"))
            required = {p for p, _, r in node.properties if r}
            return self.add_rule(rule_name, self._object_rule([(p, s) for p, s, _ in node.properties],
                                                              required, name, node.additional))
        if kind == "tuple":
            parts = [self.visit(c, f"{sub_name}tuple-{i}") for i, c in enumerate(node.children)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        if kind == "array":
            assert node.items is not None
            if node.items.kind == "any" and node.min_items == 0 and node.max_items is None:
                return self._visit_primitive(rule_name, "array")
            item = self.visit(node.items, f"{sub_name}item")
            return self.add_rule(rule_name, '"[" space ' + build_repetition(item, node.min_items, node.max_items,
                                                                            '"," space') + ' space "]"')
        if kind == "string":
            if node.pattern:
                return self._visit_pattern(node.pattern, rule_name)
            if node.fmt == "uuid":
                return self._visit_primitive(rule_name, "uuid")
            if node.fmt is not None:
                return self.add_rule(rule_name, self._primitive(f"{node.fmt}-string", STRING_FORMAT_RULES))
            if node.min_length > 0 or node.max_length is not None:
                char = self._primitive("char")
                return self.add_rule(rule_name, '"\\"" ' + build_repetition(char, node.min_length, node.max_length)
                                     + ' "\\""')
            return self._visit_primitive(rule_name, "string")
        if kind == "integer":
            if node.minimum is None and node.maximum is None:
                return self._visit_primitive(rule_name, "integer")
            return self.add_rule(rule_name, "(" + int_range(node.minimum, node.maximum) + ")")
        if kind in ("number", "boolean", "null"):
            return self._visit_primitive(rule_name, kind)
        return self.add_rule(rule_name, self._primitive("value"))

    def format_grammar(self) -> str:
        return "".join(f"{name} ::= {body}\n" for name, body in sorted(self.rules.items()))


def schema_to_grammar(schema: dict[str, Any], *, prop_order: Sequence[str] = (), dotall: bool = False) -> str:
    """The GBNF grammar (root rule ``root``) matching JSON documents valid under ``schema``."""
    check_schema(schema)  # depth and unsatisfiable allOf (llama_cpp._safety.schema_limits)
    converter = Converter(dotall=dotall)
    converter.visit(parse_schema(schema, prop_order), "")
    return converter.format_grammar()
