"""llama.cpp's own chat conformance cases, run through ``llama_cpp._chat.native_chat``.

The cases (template x raw model output -> expected message, partial outputs included) are read at
test time from the vendored ``tests/test-chat.cpp`` (:mod:`tests.chat.testchat_cases`), and checked
as that file's ``test_peg_parser`` checks them, minus the GBNF matching (which needs llama.cpp's
internal grammar API):

* the complete parse equals the expected message (content and reasoning compared stripped, tool
  call arguments as re-serialized JSON, ids exactly);
* parsing every prefix of the output (UTF-8 safe) as a stream, the accumulated deltas equal each
  partial parse, and at the end the expected message;
* a JSON schema gives an eager (non-lazy) grammar;
* where the case asks for it, re-rendering the conversation with the parsed message reproduces
  the prompt plus the output (reconstruction).

Also: every template of ``models/templates/`` applies, with and without tools.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chat.testchat_cases import Case, Msg, extract

REPO = Path(__file__).resolve().parents[2]
LLAMA_CPP = REPO / "vendor" / "llama.cpp"
TEST_CHAT = LLAMA_CPP / "tests" / "test-chat.cpp"
TEMPLATES = LLAMA_CPP / "models" / "templates"

CASES: list[Case] = extract(TEST_CHAT) if TEST_CHAT.is_file() else []
USER = Msg("user", "Hey there!")

# Cases the binding does not reproduce, with the reason (none expected: kept empty unless a case
# exercises something outside the C API).
KNOWN_DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="module")
def native_chat():
    from llama_cpp._chat import native_chat

    if not native_chat.available():
        pytest.skip("libllama-cpp-ext is not in this native build")
    return native_chat


@pytest.fixture(scope="module")
def templates(native_chat):
    cache: dict[str, Any] = {}

    def get(rel: str) -> Any:
        if rel not in cache:
            cache[rel] = native_chat.ChatTemplates((LLAMA_CPP / rel).read_text(encoding="utf-8"))
        return cache[rel]

    yield get
    for t in cache.values():
        t.close()


def _tool_json(tool: Any) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name, "description": tool.description}
    if tool.parameters:
        fn["parameters"] = json.loads(tool.parameters)
    return {"type": "function", "function": fn}


def _options(case: Case) -> dict[str, Any]:
    p = case.params
    opts: dict[str, Any] = {
        "tools": [_tool_json(t) for t in p.get("tools", [])] or None,
        "tool_choice": p.get("tool_choice", "auto"),
        "parallel_tool_calls": p.get("parallel_tool_calls", False),
        "json_schema": p.get("json_schema") or None,
        "add_generation_prompt": p.get("add_generation_prompt", True),
        "continue_final_message": p.get("continue_final_message"),
        "enable_thinking": p.get("enable_thinking", True),
        "reasoning_format": p.get("reasoning_format", "none"),  # the C++ inputs' default
    }
    return opts


def _messages(case: Case) -> list[dict[str, Any]]:
    return [m.to_openai() for m in (case.params.get("messages") or [USER])]


def _renormalize(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return ""  # partial JSON: not compared, as upstream


def assert_msg_equals(expected: Any, actual: Any) -> None:
    """``assert_msg_equals(..., ignore_whitespace_differences=true)`` of test-chat.cpp."""
    assert (expected.role or "assistant") == (actual.role or "assistant")
    assert expected.content.strip() == actual.content.strip()
    assert expected.reasoning_content.strip() == actual.reasoning_content.strip()
    exp_calls = [(n, a, i) for n, a, i in expected.tool_calls] if isinstance(expected, Msg) else [
        (c.name, c.arguments, c.id) for c in expected.tool_calls]
    act_calls = [(c.name, c.arguments, c.id) for c in actual.tool_calls]
    assert len(exp_calls) == len(act_calls), (exp_calls, act_calls)
    for (en, ea, ei), (an, aa, ai) in zip(exp_calls, act_calls):
        assert en == an
        assert _renormalize(ea) == _renormalize(aa), (ea, aa)
        assert ei == ai


def _utf8_safe_len(data: bytes) -> int:
    """The longest prefix length that does not cut a UTF-8 sequence (test-chat.cpp's helper)."""
    n = len(data)
    if n == 0:
        return 0
    i = n
    for _ in range(4):
        if i == 0:
            break
        i -= 1
        c = data[i]
        if c & 0x80 == 0:
            return n
        if c & 0xC0 == 0xC0:
            if c & 0xE0 == 0xC0:
                need = 2
            elif c & 0xF0 == 0xE0:
                need = 3
            elif c & 0xF8 == 0xF0:
                need = 4
            else:
                return i
            return n if n - i >= need else i
    return n - min(n, 3)


class _Accum:
    """The message test-chat.cpp accumulates from the diffs of successive partial parses."""

    def __init__(self) -> None:
        self.role = "assistant"
        self.content = ""
        self.reasoning_content = ""
        self.calls: list[list[str]] = []

    def add(self, diff: Any) -> None:
        self.reasoning_content += diff.reasoning_content
        self.content += diff.content
        if diff.index is not None:
            while len(self.calls) <= diff.index:
                self.calls.append(["", "", ""])
            call = self.calls[diff.index]
            if diff.name:
                call[0] = diff.name
            if diff.id:
                call[2] = diff.id
            call[1] += diff.arguments

    @property
    def tool_calls(self) -> list[Any]:
        from llama_cpp._chat.native_chat import ToolCall

        return [ToolCall(n, a, i) for n, a, i in self.calls]


@pytest.mark.skipif(not CASES, reason="vendor/llama.cpp/tests/test-chat.cpp is not vendored")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case, templates, native_chat) -> None:
    if case.skip:
        pytest.skip(case.skip)
    if case.id in KNOWN_DIFFERENCES:
        pytest.xfail(KNOWN_DIFFERENCES[case.id])
    t = templates(case.template)
    messages = _messages(case)
    opts = _options(case)
    prompt = t.apply(messages, **opts)
    params = prompt.parser_params(reasoning_format="none")  # common_chat_parser_params(params): format + prompt
    data = case.input.encode("utf-8")

    with native_chat.ChatParser(params) as parser:
        prev = native_chat.ChatMessage()
        accum = _Accum()
        for i in range(1, len(data) + 1):
            is_partial = i < len(data) or case.is_partial
            prefix = data[:_utf8_safe_len(data[:i])]
            current = parser.parse(prefix, is_partial=is_partial)
            for diff in native_chat.compute_diffs(prev, current):
                accum.add(diff)
            assert_msg_equals(current, accum)
            prev = current
        if not case.is_partial:
            assert_msg_equals(case.expect, parser.parse(data, is_partial=False))
        assert_msg_equals(case.expect, accum)

        if case.params.get("json_schema"):
            assert prompt.grammar, "json_schema is set but no grammar was produced"
            assert not prompt.grammar_lazy, "json_schema is set but the grammar is lazy"

        if case.expect_reconstruction and not case.is_partial:
            parsed = parser.parse(data, is_partial=False)
            msg = case.expect.copy()
            msg.role = msg.role or "assistant"
            msg.tool_calls = [(n, parsed.tool_calls[k].arguments if k < len(parsed.tool_calls) else a, i)
                              for k, (n, a, i) in enumerate(msg.tool_calls)]
            again = t.apply(messages + [msg.to_openai()], **{**opts, "add_generation_prompt": False})
            expected_text = prompt.prompt + case.input
            assert again.prompt == expected_text or again.prompt.startswith(expected_text), (
                f"reconstruction mismatch:\n{expected_text!r}\n{again.prompt!r}")


def test_cases_were_extracted() -> None:
    """The extractor keeps up with the file: most cases evaluate (the rest skip with a reason)."""
    if not CASES:
        pytest.skip("vendor/llama.cpp/tests/test-chat.cpp is not vendored")
    evaluated = [c for c in CASES if not c.skip]
    assert len(CASES) >= 400 and len(evaluated) >= 0.95 * len(CASES), (len(CASES), len(evaluated))


TEMPLATE_FILES = sorted(TEMPLATES.glob("*.jinja")) if TEMPLATES.is_dir() else []
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOL_CONVERSATION = CONVERSATION + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function",  # Mistral's templates want 9 alphanumerics
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "sunny"},
]


@pytest.mark.skipif(not TEMPLATE_FILES, reason="vendor/llama.cpp/models/templates is not vendored")
@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=[p.stem for p in TEMPLATE_FILES])
def test_every_template_applies(path: Path, native_chat) -> None:
    """With and without tools; a tool call and its result rendered back where the template supports them."""
    with native_chat.ChatTemplates(path.read_text(encoding="utf-8"), bos_token="<s>", eos_token="</s>") as t:
        plain = t.apply(CONVERSATION, now=0)
        assert "Paris" in plain.prompt
        tools = t.apply(CONVERSATION, tools=[WEATHER], now=0)
        assert "Paris" in tools.prompt
        if t.caps.get("supports_tool_calls"):  # the others drop or refuse tool turns, as with llama-server
            history = t.apply(TOOL_CONVERSATION, tools=[WEATHER], now=0)
            assert "sunny" in history.prompt
