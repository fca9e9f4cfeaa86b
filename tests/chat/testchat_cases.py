"""Read the template conformance cases out of llama.cpp's ``tests/test-chat.cpp`` at test time.

That file states its cases in a small C++ builder language::

    auto tst = peg_tester("models/templates/X.jinja", detailed_debug);
    tst.test("<raw model output>").tools({ special_function_tool }).enable_thinking(false)
        .expect(message_assist_call).run();

This module tokenizes the file and evaluates just that subset: string literals (raw ones too),
the file's tool and message constants and helper calls (``simple_assist_msg``...), brace lists,
enum names and local string constants. A case using anything else is returned with ``skip`` set to
the reason. Nothing of llama.cpp's test code is copied; the vendored file is the source of truth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<pp>^[ \t]*\#[^\n]*)
  | (?P<lc>//[^\n]*)
  | (?P<bc>/\*.*?\*/)
  | (?P<raw>(?:u8)?R"(?P<delim>[^(\s"]*)\((?P<rawbody>.*?)\)(?P=delim)")
  | (?P<str>(?:u8)?"(?:[^"\\\n]|\\.)*")
  | (?P<chr>'(?:[^'\\\n]|\\.)+')
  | (?P<num>\d+(?:\.\d+)?[fFuUlLzZ]*)
  | (?P<id>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)
  | (?P<op>::|->|&&|\|\||==|!=|<=|>=|[{}()\[\],;.=<>+\-*/&|!?:~%^\#])
""", re.S | re.X | re.M)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "?": "?"}


@dataclass(frozen=True)
class Tok:
    kind: str  # str, num, id, op
    value: Any
    line: int


def _unescape(body: str) -> str:
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        n = body[i + 1]
        if n == "x":
            m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
            assert m, body
            out.append(int(m.group(0), 16) & 0xFF)
            i += 2 + len(m.group(0))
        elif n in "uU":
            width = 4 if n == "u" else 8
            out += chr(int(body[i + 2:i + 2 + width], 16)).encode("utf-8")
            i += 2 + width
        elif n in "01234567" and n != "0" or (n == "0" and i + 2 < len(body) and body[i + 2] in "01234567"):
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            assert m
            out.append(int(m.group(0), 8) & 0xFF)
            i += 1 + len(m.group(0))
        else:
            out += _ESCAPES[n].encode("utf-8")
            i += 2
    return out.decode("utf-8", "surrogateescape")


def tokenize(text: str) -> list[Tok]:
    toks: list[Tok] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot tokenize line {line}: {text[pos:pos + 40]!r}")
        kind = m.lastgroup if m.lastgroup not in ("delim", "rawbody") else "raw"
        s = m.group(0)
        if kind == "raw":
            toks.append(Tok("str", m.group("rawbody"), line))
        elif kind == "str":
            toks.append(Tok("str", _unescape(s[s.index('"') + 1:-1]), line))
        elif kind == "num":
            toks.append(Tok("num", float(s.rstrip("fFuUlLzZ")) if "." in s else int(s.rstrip("fFuUlLzZ")), line))
        elif kind in ("id", "op", "chr"):
            toks.append(Tok(kind, s, line))
        line += s.count("\n")
        pos = m.end()
    return toks


class Unsupported(Exception):
    """An expression outside the evaluated subset."""


@dataclass
class Msg:
    """``common_chat_msg`` as the file builds it."""

    role: str = ""
    content: str = ""
    content_parts: list[tuple[str, str]] = field(default_factory=list)
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # name, arguments, id
    reasoning_content: str = ""
    tool_name: str = ""
    tool_call_id: str = ""

    def copy(self) -> Msg:
        return Msg(self.role, self.content, list(self.content_parts), list(self.tool_calls), self.reasoning_content,
                   self.tool_name, self.tool_call_id)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI message ``common_chat_msgs_parse_oaicompat`` reads back into this message."""
        d: dict[str, Any] = {"role": self.role}
        if self.content_parts:
            d["content"] = [{"type": t, "text": x} for t, x in self.content_parts]
        else:
            d["content"] = self.content
        if self.tool_calls:
            d["tool_calls"] = [{"type": "function", "id": i, "function": {"name": n, "arguments": a}}
                               for n, a, i in self.tool_calls]
        if self.reasoning_content:
            d["reasoning_content"] = self.reasoning_content
        if self.tool_name:
            d["name"] = self.tool_name
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: str

    def to_openai(self) -> dict[str, Any]:
        import json

        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(self.parameters) if self.parameters else {}}}


_ENUMS: dict[str, tuple[str, Any]] = {
    "COMMON_REASONING_FORMAT_NONE": ("reasoning", "none"),
    "COMMON_REASONING_FORMAT_AUTO": ("reasoning", "auto"),
    "COMMON_REASONING_FORMAT_DEEPSEEK": ("reasoning", "deepseek"),
    "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": ("reasoning", "deepseek-legacy"),
    "COMMON_CHAT_TOOL_CHOICE_AUTO": ("tool_choice", "auto"),
    "COMMON_CHAT_TOOL_CHOICE_REQUIRED": ("tool_choice", "required"),
    "COMMON_CHAT_TOOL_CHOICE_NONE": ("tool_choice", "none"),
    "COMMON_CHAT_CONTINUATION_NONE": ("continuation", None),
    "COMMON_CHAT_CONTINUATION_AUTO": ("continuation", True),
    "COMMON_CHAT_CONTINUATION_REASONING": ("continuation", "reasoning_content"),
    "COMMON_CHAT_CONTINUATION_CONTENT": ("continuation", "content"),
}


@dataclass
class Case:
    """One ``tst.test(...)...run()`` of the file."""

    template: str  # relative to the llama.cpp tree
    line: int
    input: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    expect: Msg = field(default_factory=lambda: Msg())
    is_partial: bool = False
    expect_reconstruction: bool = False
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{Path(self.template).stem}:{self.line}"


class _Eval:
    def __init__(self, toks: list[Tok]) -> None:
        self.t = toks
        self.env: dict[str, Any] = {}

    # -- expressions
    def expr(self, i: int, stop: tuple[str, ...]) -> tuple[Any, int]:
        """Evaluate from ``i`` up to (not including) a top-level token in ``stop``."""
        value, i = self.primary(i)
        while self.t[i].value not in stop:
            if self.t[i].value == "+":
                rhs, i = self.primary(i + 1)
                if not isinstance(value, str) or not isinstance(rhs, str):
                    raise Unsupported(f"'+' on {type(value).__name__} and {type(rhs).__name__}")
                value += rhs
            elif self.t[i].value == "." and self.t[i + 1].value in ("dump", "c_str", "get"):
                raise Unsupported(f"method call .{self.t[i + 1].value}()")
            else:
                raise Unsupported(f"token {self.t[i].value!r} at line {self.t[i].line}")
        return value, i

    def args(self, i: int, close: str) -> tuple[list[Any], int]:
        """Comma-separated expressions from ``i`` up to ``close``; returns the index after it."""
        out: list[Any] = []
        if self.t[i].value == close:
            return out, i + 1
        while True:
            v, i = self.expr(i, (",", close))
            out.append(v)
            if self.t[i].value == close:
                return out, i + 1
            i += 1
            if self.t[i].value == close:  # trailing comma
                return out, i + 1

    def primary(self, i: int) -> tuple[Any, int]:
        tok = self.t[i]
        if tok.kind == "str":
            s = tok.value
            i += 1
            while self.t[i].kind == "str":
                s += self.t[i].value
                i += 1
            return s, i
        if tok.kind == "num":
            return tok.value, i + 1
        if tok.value == "{":
            return self.args(i + 1, "}")
        if tok.value == "-" and self.t[i + 1].kind == "num":
            return -self.t[i + 1].value, i + 2
        if tok.kind == "id":
            name = tok.value
            if name in ("true", "false"):
                return name == "true", i + 1
            if name in ("std::string", "std::string_view") and self.t[i + 1].value == "(":
                a, j = self.args(i + 2, ")")
                if len(a) != 1 or not isinstance(a[0], str):
                    raise Unsupported("std::string(...) of a non-string")
                return a[0], j
            if name in ("std::string", "std::string_view") and self.t[i + 1].value == "{":
                a, j = self.args(i + 2, "}")
                return ("".join(a) if a else ""), j
            if name in _ENUMS:
                return _ENUMS[name], i + 1
            if self.t[i + 1].value == "(":
                a, j = self.args(i + 2, ")")
                return self.call(name, a), j
            if name == "common_chat_msg" and self.t[i + 1].value == "{":
                a, j = self.args(i + 2, "}")
                return self.to_msg(a), j
            if name in self.env:
                v = self.env[name]
                return (v.copy() if isinstance(v, Msg) else v), i + 1
            raise Unsupported(f"unknown name {name} (line {tok.line})")
        raise Unsupported(f"token {tok.value!r} at line {tok.line}")

    def call(self, name: str, a: list[Any]) -> Any:
        def s(k: int) -> str:
            v = a[k] if k < len(a) else ""
            if not isinstance(v, str):
                raise Unsupported(f"{name}: argument {k} is not a string")
            return v

        if name == "simple_assist_msg":
            m = Msg("assistant", s(0), reasoning_content=s(1))
            if s(2) or s(4):
                m.tool_calls.append((s(2), s(3), s(4)))
            return m
        if name == "message_with_tool_calls":
            return Msg("assistant", tool_calls=[(s(0), s(1), "")])
        if name in ("message_with_tool_calls_and_reasoning",):
            return Msg("assistant", reasoning_content=s(2), tool_calls=[(s(0), s(1), "")])
        if name == "message_with_reasoning_and_tool_call":
            return Msg("assistant", reasoning_content=s(0), tool_calls=[(s(1), s(2), "")])
        if name == "message_with_content_and_tool_call":
            return Msg("assistant", s(0), tool_calls=[(s(1), s(2), "")])
        if name == "message_with_reasoning_content_and_multiple_tool_calls":
            return Msg("assistant", s(1), reasoning_content=s(0), tool_calls=[(n, x, "") for n, x in a[2]])
        raise Unsupported(f"call of {name}()")

    @staticmethod
    def to_msg(a: list[Any]) -> Msg:
        fields = a + [""] * (7 - len(a))
        parts = [tuple(p) for p in (fields[2] or [])]
        calls = [_tool_call(c) for c in (fields[3] or [])]
        return Msg(fields[0], fields[1], parts, calls, fields[4] or "", fields[5] or "", fields[6] or "")

    @staticmethod
    def to_tool(a: list[Any]) -> Tool:
        if len(a) != 3 or not all(isinstance(x, str) for x in a):
            raise Unsupported("common_chat_tool that is not three strings")
        return Tool(*a)


def _tool_call(v: Any) -> tuple[str, str, str]:
    if not isinstance(v, list) or not 1 <= len(v) <= 3:
        raise Unsupported(f"tool call {v!r}")
    name, args, cid = (v + ["", "", ""])[:3]
    return (name, args if isinstance(args, str) else "", cid if isinstance(cid, str) else "")


_DECL_TYPES = {"common_chat_tool", "common_chat_msg", "std::string", "char", "auto", "std::string_view"}


def extract(path: Path) -> list[Case]:
    """Every peg_tester case of ``tests/test-chat.cpp`` (unsupported ones carry ``skip``)."""
    toks = tokenize(path.read_text(encoding="utf-8")) + [Tok("op", ";", -1)] * 4
    ev = _Eval(toks)
    testers: dict[str, list[str] | str] = {}
    cases: list[Case] = []
    params: dict[str, str] = {}  # a function's string parameter -> the function (static void F(const std::string & P
    by_function: dict[str, list[Case]] = {}  # cases whose template is a parameter of that function
    current_function = ""
    i = 0
    n = len(toks)
    while i < n - 4:
        tok = toks[i]
        # static void F(const std::string & P, ...) {
        if tok.value == "void" and toks[i + 1].kind == "id" and toks[i + 2].value == "(":
            current_function = toks[i + 1].value
            if [t.value for t in toks[i + 3:i + 6]] == ["const", "std::string", "&"] and toks[i + 6].kind == "id":
                params[toks[i + 6].value] = current_function
        # for (const auto & X : { "a", "b" })   /   for (const char * X : { ... })
        if tok.value == "for" and toks[i + 1].value == "(":
            j = i + 2
            while toks[j].value in ("const", "auto", "char", "*", "&", "std::string"):
                j += 1
            if toks[j].kind == "id" and toks[j + 1].value == ":" and toks[j + 2].value == "{":
                try:
                    values, _ = ev.args(j + 3, "}")
                    if all(isinstance(v, str) for v in values):
                        ev.env[toks[j].value] = values
                except Unsupported:
                    pass
        # F(X, ...) of a function whose tester takes its template from a parameter
        if tok.kind == "id" and tok.value in by_function and toks[i + 1].value == "(" and toks[i - 1].value != "void":
            try:
                value, _ = ev.expr(i + 2, (",", ")"))
                for path in ([value] if isinstance(value, str) else value):
                    for c in by_function[tok.value]:
                        cases.append(Case(path, c.line, c.input, dict(c.params), c.expect.copy(), c.is_partial,
                                          c.expect_reconstruction, c.skip))
            except Unsupported:
                pass
        # auto tst = peg_tester("models/templates/X.jinja", ...);
        if tok.kind == "id" and toks[i + 1].value == "=" and toks[i + 2].value == "peg_tester":
            first = toks[i + 4]
            if first.kind == "id" and first.value in params and first.value not in ev.env:
                testers[tok.value] = "param:" + params[first.value]
            else:
                try:
                    path_value, _ = ev.expr(i + 4, (",", ")"))
                    testers[tok.value] = path_value if isinstance(path_value, (str, list)) else ""
                except Unsupported:
                    testers[tok.value] = ""
            i += 3
            continue
        # tst.test(...)....run();
        if tok.kind == "id" and tok.value in testers and toks[i + 1].value == "." and toks[i + 2].value == "test":
            template = testers[tok.value]
            paths = template if isinstance(template, list) else [template]
            end = i
            for path in paths:
                case, end = _case(ev, toks, i, path)
                if path.startswith("param:"):
                    by_function.setdefault(path[len("param:"):], []).append(case)
                else:
                    cases.append(case)
            i = end
            continue
        # const common_chat_msg NAME = ...;   static common_chat_tool NAME{...};   const char * NAME = R"(...)";
        if tok.kind == "id" and tok.value in _DECL_TYPES and toks[i + 1].kind in ("id", "op"):
            j = i + 1
            while toks[j].value in ("*", "&", "const"):
                j += 1
            if toks[j].kind == "id" and toks[j + 1].value in ("=", "{"):
                name = toks[j].value
                try:
                    if toks[j + 1].value == "{":
                        a, k = ev.args(j + 2, "}")
                        value: Any = ev.to_tool(a) if tok.value == "common_chat_tool" else ev.to_msg(a)
                    else:
                        value, k = ev.expr(j + 2, (";",))
                        if tok.value == "common_chat_tool" and isinstance(value, list):
                            value = ev.to_tool(value)
                        elif tok.value == "common_chat_msg" and isinstance(value, list):
                            value = ev.to_msg(value)
                    ev.env[name] = value
                    i = k
                    continue
                except (Unsupported, IndexError, AssertionError):
                    ev.env.pop(name, None)
        # common_chat_msg m;  m.role = "user";  (a message built field by field)
        if tok.value == "common_chat_msg" and toks[i + 1].kind == "id" and toks[i + 2].value == ";":
            ev.env[toks[i + 1].value] = Msg()
            i += 3
            continue
        if tok.kind == "id" and isinstance(ev.env.get(tok.value), Msg) and toks[i + 1].value == "." \
                and toks[i + 3].value == "=" and toks[i + 2].value in Msg.__dataclass_fields__:
            try:
                value, k = ev.expr(i + 4, (";",))
                setattr(ev.env[tok.value], toks[i + 2].value, value)
                i = k
                continue
            except Unsupported:
                ev.env.pop(tok.value, None)
        # static std::vector<common_chat_tool> tools{ a, b };
        if tok.value == "std::vector" and toks[i + 1].value == "<" and toks[i + 2].value in (
                "common_chat_tool", "common_chat_msg") and toks[i + 3].value == ">" and toks[i + 4].kind == "id" \
                and toks[i + 5].value in ("{", "="):
            name = toks[i + 4].value
            try:
                start = i + 6 if toks[i + 5].value == "{" else i + 7
                a, k = ev.args(start, "}")
                ev.env[name] = a
                i = k
                continue
            except (Unsupported, IndexError):
                ev.env.pop(name, None)
        i += 1
    return cases


_SETTERS = {"reasoning_format", "tools", "enable_thinking", "parallel_tool_calls", "add_generation_prompt",
            "continue_final_message", "json_schema", "tool_choice", "messages"}


def _case(ev: _Eval, toks: list[Tok], i: int, template: str) -> tuple[Case, int]:
    case = Case(template=template, line=toks[i].line)
    # find the end of the statement first, so that a failure anywhere skips the whole chain
    depth, j = 0, i
    while True:
        v = toks[j].value
        if v in ("(", "{", "["):
            depth += 1
        elif v in (")", "}", "]"):
            depth -= 1
        elif v == ";" and depth == 0:
            break
        j += 1
    end = j + 1
    if not template:
        case.skip = "the tester's template path is not a literal"
        return case, end
    try:
        k = i + 3
        if toks[k].value != "(":
            raise Unsupported("test without arguments")
        a, k = ev.args(k + 1, ")")
        if len(a) != 1 or not isinstance(a[0], str):
            raise Unsupported("test() input is not a string")
        case.input = a[0]
        case.params["add_generation_prompt"] = True
        while toks[k].value == ".":
            method = toks[k + 1].value
            args, k = ev.args(k + 3, ")")
            _apply(case, method, args)
        if method != "run":
            raise Unsupported("chain does not end in run()")
    except (Unsupported, IndexError, KeyError, TypeError, ValueError) as exc:
        case.skip = f"unsupported construct: {exc}"
    return case, end


def _apply(case: Case, method: str, args: list[Any]) -> None:
    one = args[0] if args else None
    if method == "run":
        return
    if method in ("reasoning_format", "tool_choice", "continue_final_message"):
        if not (isinstance(one, tuple) and len(one) == 2):
            raise Unsupported(f"{method}({one!r})")
        case.params[method] = one[1]
    elif method == "tools":
        if not isinstance(one, list):
            raise Unsupported("tools() of a non-list")
        # a tool is a named constant or written in place as {name, description, parameters}
        tools = [t if isinstance(t, Tool) else _Eval.to_tool(t) if isinstance(t, list) else None for t in one]
        if not all(tools):
            raise Unsupported("tools() of non-tools")
        case.params["tools"] = tools
    elif method == "messages":
        if not isinstance(one, list) or not all(isinstance(m, Msg) for m in one):
            raise Unsupported("messages() of non-messages")
        case.params["messages"] = one
    elif method in ("enable_thinking", "parallel_tool_calls", "add_generation_prompt"):
        if not isinstance(one, bool):
            raise Unsupported(f"{method}({one!r})")
        case.params[method] = one
    elif method == "json_schema":
        if not isinstance(one, str):
            raise Unsupported("json_schema of a non-string")
        case.params["json_schema"] = one
    elif method == "is_partial":
        case.is_partial = bool(one)
    elif method == "expect_reconstruction":
        case.expect_reconstruction = True if one is None else bool(one)
    elif method == "expect":
        if not isinstance(one, Msg):
            raise Unsupported("expect() of a non-message")
        case.expect = one.copy()
    elif method == "expect_content":
        case.expect.content = one
    elif method == "expect_reasoning":
        case.expect.reasoning_content = one
    elif method == "expect_tool_calls":
        case.expect.tool_calls = [_tool_call(c) for c in one]
    else:
        raise Unsupported(f"builder method .{method}()")
