"""The binding of libllama-cpp-ext (``llama_cpp._chat.native_chat``): errors, options, streaming."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from llama_cpp._errors import ClosedError, LlamaError, TemplateError

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "vendor" / "llama.cpp" / "models" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def nc():
    from llama_cpp._chat import native_chat

    if not native_chat.available():
        pytest.skip("libllama-cpp-ext is not in this native build")
    return native_chat


def _template(name: str) -> str:
    path = TEMPLATES / name
    if not path.is_file():
        pytest.skip(f"{path} is not vendored")
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def qwen3(nc):
    with nc.ChatTemplates(_template("Qwen-Qwen3-0.6B.jinja")) as t:
        yield t


def test_library_api_version(nc):
    lib = nc.load_library()
    assert lib.api_version() == nc.API_VERSION
    assert lib.path.name.startswith(("libllama-cpp-ext", "llama-cpp-ext"))


@pytest.mark.parametrize("source", ["{% for %}", "{{ unclosed", "{% if x %}no endif"])
def test_a_broken_template_raises_instead_of_aborting(nc, source):
    with pytest.raises(TemplateError) as exc:
        nc.ChatTemplates(source).apply(ASK)
    assert isinstance(exc.value, (ValueError, LlamaError))


def test_no_template_and_no_model_is_refused(nc):
    with pytest.raises(TemplateError, match="chat_template text or a model"):
        nc.ChatTemplates()


def test_bad_json_and_bad_inputs_come_back_as_errors(nc, qwen3):
    lib = nc.load_library()
    doc = lib.take_json(lib.apply(qwen3._handle, b"{not json"))
    assert doc["kind"] == "json" and "error" in doc
    doc = lib.take_json(lib.apply(qwen3._handle, b"[1, 2]"))
    assert doc["kind"] == "invalid_argument"
    doc = lib.take_json(lib.apply(None, b"{}"))
    assert "NULL" in doc["error"]
    with pytest.raises(TemplateError, match="messages"):
        qwen3.apply([{"content": "no role"}])
    with pytest.raises(TemplateError, match="tool_choice"):
        qwen3.apply(ASK, tools=[WEATHER], tool_choice="sometimes")
    with pytest.raises(TemplateError, match="reasoning_format"):
        qwen3.apply(ASK, reasoning_format="verbose")
    with pytest.raises(TemplateError, match="enable_thinking must be a boolean"):
        qwen3.apply(ASK, chat_template_kwargs={"enable_thinking": "no"})


def test_bad_parser_params_raise(nc):
    with pytest.raises(nc.ChatParseError):
        nc.parse_chat({"format": 999}, "x")
    with pytest.raises(nc.ChatParseError):
        nc.parse_chat({"format": 1, "parser": "not a parser"}, "x")


def test_apply_renders_tools_and_the_generation_prompt(qwen3):
    p = qwen3.apply(ASK, tools=[WEATHER], now=0)
    assert "get_weather" in p.prompt and p.prompt.endswith("<|im_start|>assistant\n")
    assert p.format_name.startswith("peg") and p.parser
    assert p.grammar and p.grammar_lazy and p.grammar_triggers
    assert p.supports_thinking and p.thinking_start_tag == "<think>" and p.thinking_end_tags == ("</think>",)


def test_chat_template_kwargs_reach_the_template(qwen3):
    thinking = qwen3.apply(ASK)
    quiet = qwen3.apply(ASK, chat_template_kwargs={"enable_thinking": False})
    assert not thinking.prompt.endswith("</think>\n\n")
    assert quiet.prompt.endswith("<think>\n\n</think>\n\n") and not quiet.enable_thinking
    assert qwen3.apply(ASK, reasoning_effort="none").prompt == quiet.prompt


def test_tool_choice_none_required_and_named(qwen3):
    auto = qwen3.apply(ASK, tools=[WEATHER, TIME])
    none = qwen3.apply(ASK, tools=[WEATHER, TIME], tool_choice="none")
    required = qwen3.apply(ASK, tools=[WEATHER, TIME], tool_choice="required")
    named = qwen3.apply(ASK, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert auto.grammar_lazy and not required.grammar_lazy and not none.grammar
    assert "get_weather" not in named.grammar and "get-time" in named.grammar.replace("_", "-")
    assert not named.grammar_lazy and named.tools_applied == 1
    with pytest.raises(TemplateError, match="not among the tools"):
        qwen3.apply(ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})


def test_parse_tool_calls_and_reasoning(nc, qwen3):
    p = qwen3.apply(ASK, tools=[WEATHER])
    msg = nc.parse_chat(p, "<think>\nLet me check.\n</think>\n\n" + QWEN_CALL)
    assert msg.reasoning_content.strip() == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
    oai = msg.to_openai()
    assert oai["content"] is None and oai["tool_calls"][0]["function"]["name"] == "get_weather"
    assert oai["reasoning_content"].strip() == "Let me check."
    # reasoning_format none (in the prompt, which builds the parser): thinking stays in the content
    raw = nc.parse_chat(qwen3.apply(ASK, reasoning_format="none"), "<think>\nhm\n</think>\n\nHi!")
    assert raw.content.startswith("<think>") and not raw.reasoning_content


def test_tool_messages_round_trip_through_the_template(qwen3):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    p = qwen3.apply(history, tools=[WEATHER])
    assert '"city": "Paris"' in p.prompt and "<tool_response>\nsunny\n</tool_response>" in p.prompt


def test_stream_deltas_name_first_then_arguments(nc, qwen3):
    p = qwen3.apply(ASK, tools=[WEATHER])
    ids = iter(["call_0", "call_1"])
    stream = nc.ChatStreamParser(p, id_factory=lambda: next(ids))
    text = "<think>\nLet me check.\n</think>\n\nSure.\n" + QWEN_CALL
    deltas = []
    for ch in text:
        deltas += stream.feed(ch)
    deltas += stream.finish()
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert reasoning.strip() == "Let me check." and content.strip() == "Sure."
    head = calls[0]
    assert head == {"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather"}}
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])
    assert json.loads("".join(c["function"]["arguments"] for c in calls[1:])) == {"city": "Paris"}
    assert stream.message.tool_calls[0].id == "call_0"
    stream.close()
    with pytest.raises(ClosedError):
        stream.feed("x")


def test_compute_diffs_matches_llama_cpp_rules(nc):
    a = nc.ChatMessage(content="Hel")
    b = nc.ChatMessage(content="Hello", tool_calls=(nc.ToolCall("f", '{"x"', "1"),))
    diffs = nc.compute_diffs(a, b)
    assert [(d.content, d.index, d.name, d.arguments) for d in diffs] == [("lo", None, "", ""), ("", 0, "f", '{"x"')]
    with pytest.raises(nc.ChatParseError):
        nc.compute_diffs(b, a)


def test_closed_templates_refuse(nc):
    t = nc.ChatTemplates("{{ messages[0].content }}")
    assert t.apply(ASK).prompt == "Weather in Paris?"
    t.close()
    t.close()
    with pytest.raises(ClosedError):
        t.apply(ASK)


def test_a_model_pointer_is_required_to_be_non_null(nc):
    with pytest.raises(TemplateError, match="NULL"):
        nc.ChatTemplates(model=ctypes.c_void_p(None))


def test_the_smoke_stage_passes_on_this_build(nc, native_build, tmp_path):
    """The release smoke's ``chat`` stage, on an installed-package layout over this native build."""
    import argparse

    from build_tools.stages.smoke import workload

    pkg = tmp_path / "llama_cpp"
    pkg.mkdir()
    (pkg / "lib").symlink_to(Path(nc.load_library().path).parent, target_is_directory=True)
    (pkg / "native-manifest.json").write_text((native_build.root / "native-manifest.json").read_text())
    ctx = workload.Context(argparse.Namespace(source_build=False))
    ctx.pkg = pkg
    detail = workload.stage_chat(ctx)
    assert "tool call and reasoning parsed" in detail and "libllama-cpp-ext" in detail


def _completion(text: str, finish: str = "stop") -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}


def _chunks(text: str, size: int = 3):
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    for k, piece in enumerate(pieces):
        c = _completion(piece, "stop" if k == len(pieces) - 1 else None)
        if k != len(pieces) - 1:
            del c["usage"]
        yield c


def test_chat_response_parses_tool_calls_and_reasoning(nc, qwen3):
    from llama_cpp._chat import native_completion as ncomp

    p = qwen3.apply(ASK, tools=[WEATHER])
    r = ncomp.chat_response(_completion("<think>\nhm\n</think>\n\n" + QWEN_CALL), p)
    choice = r["choices"][0]
    assert r["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"].strip() == "hm"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"] and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    plain = ncomp.chat_response(_completion("<think>\nhm\n</think>\n\nIt is sunny.", "length"), p)
    assert plain["choices"][0]["finish_reason"] == "length"
    assert plain["choices"][0]["message"]["content"].strip() == "It is sunny."


def test_chat_stream_yields_role_deltas_and_the_finish_reason(nc, qwen3):
    from llama_cpp._chat import native_completion as ncomp

    p = qwen3.apply(ASK, tools=[WEATHER])
    out = list(ncomp.chat_stream(_chunks("<think>\nhm\n</think>\n\nOk. " + QWEN_CALL), p, id_factory=lambda: "c0"))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls" and out[-1]["usage"]["total_tokens"] == 8
    deltas = [c["choices"][0]["delta"] for c in out[1:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "c0" and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"city": "Paris"}
    assert "".join(d.get("content", "") for d in deltas).strip() == "Ok."


def test_response_format_schema_reads_like_llama_server():
    from llama_cpp._chat.native_completion import response_format_schema

    assert response_format_schema(None) is None and response_format_schema({"type": "text"}) is None
    assert response_format_schema({"type": "json_object"}) == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert response_format_schema({"type": "json_schema", "json_schema": {"schema": schema}}) == schema
    with pytest.raises(ValueError):
        response_format_schema({"type": "xml"})


UNIT = {"type": "function", "function": {
    "name": "get_unit", "description": "Pick a unit",
    "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["unit"]}}}


@pytest.fixture(scope="module")
def tiny_llama(nc):
    from build_tools.fixtures import fixture_path
    from llama_cpp import Llama

    llm = Llama(model_path=str(fixture_path("llama_bpe")), n_ctx=1024, verbose=False, chat_format="llama-cpp")
    yield llm
    llm.close()


def test_a_llama_chats_through_the_native_layer_with_a_named_tool(nc, tiny_llama, monkeypatch):
    """The handler's request to the model: its template's prompt, the tool grammar advanced past the
    generation prompt, and the output parsed (the tiny model's own output is random: it is stood in
    for by a canned one, after the real generation ran under the grammar)."""
    from llama_cpp._chat.constraint import ChatConstraint
    from llama_cpp._chat.native_completion import NativeChatHandler

    # the fixture's ChatML template has no tools: a Qwen 3 template text replaces it
    handler = NativeChatHandler(_template("Qwen-Qwen3-0.6B.jinja"), chat_template_kwargs={"enable_thinking": False})
    monkeypatch.setattr(tiny_llama, "chat_handler", handler)
    seen = {}
    real = tiny_llama.create_completion
    canned = '<tool_call>\n{"name": "get_unit", "arguments": {"unit": "c"}}\n</tool_call>'

    def create_completion(prompt, **kw):
        seen.update(kw, prompt=prompt)
        out = real(prompt, **{**kw, "stream": False})  # generation under the grammar runs for real
        assert out["choices"][0]["finish_reason"] in ("stop", "length")
        if kw.get("stream"):
            return iter([{**out, "choices": [{**out["choices"][0], "text": canned, "finish_reason": "stop"}]}])
        out["choices"][0]["text"] = canned
        return out

    monkeypatch.setattr(tiny_llama, "create_completion", create_completion)
    r = tiny_llama.create_chat_completion(ASK, tools=[WEATHER, UNIT], tool_choice="get_unit", max_tokens=8, seed=1)
    constraint = seen["grammar"]
    assert isinstance(constraint, ChatConstraint) and constraint.has_grammar
    assert "get-unit" in constraint.prompt.grammar.replace("_", "-") and not constraint.prompt.grammar_lazy
    assert constraint.params["generation_prompt"] == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert constraint.params["prefill_grammar"]  # the template's grammar starts past the generation prompt
    assert tiny_llama.detokenize(seen["prompt"][-8:], special=True).decode().endswith("</think>\n\n")
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_unit" and json.loads(call["function"]["arguments"]) == {"unit": "c"}
    chunks = list(tiny_llama.create_chat_completion(ASK, tools=[UNIT], tool_choice="required", max_tokens=8,
                                                    seed=1, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["function"]["name"] == "get_unit" and calls[0]["id"]
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"unit": "c"}
    # without tools the template's plain chat comes back as content
    monkeypatch.setattr(tiny_llama, "create_completion", real)
    plain = tiny_llama.create_chat_completion(ASK, max_tokens=4, seed=1)["choices"][0]
    assert plain["message"]["role"] == "assistant" and "tool_calls" not in plain["message"]


def test_chat_format_llama_cpp_selects_the_native_handler(tiny_llama):
    from llama_cpp._chat.native_completion import NativeChatHandler

    assert isinstance(tiny_llama.chat_handler, NativeChatHandler)
    r = tiny_llama.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, seed=1)
    assert r["choices"][0]["message"]["role"] == "assistant" and "tool_calls" not in r["choices"][0]["message"]


def test_a_chat_grammar_starts_past_the_generation_prompt(nc, tiny_llama):
    """As llama.cpp's common_sampler: the template's grammar spans the generation prompt, which is
    already in the prompt, so the sampler accepts its tokens first; a caller's grammar does not."""
    from llama_cpp._chat.constraint import ChatConstraint

    prompt = nc.ChatPrompt(prompt="", format=0, format_name="test", grammar='root ::= "<|im_start|>assistant\\n" "yes"',
                           generation_prompt="<|im_start|>assistant\n")
    out = tiny_llama.create_completion("hi", grammar=ChatConstraint(tiny_llama.model, prompt), max_tokens=4)
    assert out["choices"][0]["text"] == "yes"
    with pytest.raises(LlamaError):  # the caller's grammar is not prefilled: "yes" cannot start it
        tiny_llama.create_completion("hi", max_tokens=4, logits_processor=_only(tiny_llama, b"yes"),
                                     grammar=ChatConstraint(tiny_llama.model, prompt, user_grammar=True))


def test_a_caller_s_grammar_constrains_the_native_chat(tiny_llama):
    for stream in (False, True):
        out = tiny_llama.create_chat_completion(ASK, grammar='root ::= "yes" | "no"', max_tokens=4, seed=1,
                                                stream=stream)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in out) if stream else \
            out["choices"][0]["message"]["content"]
        assert text in ("yes", "no")
    with pytest.raises(ValueError, match="cannot be combined with tools"):
        tiny_llama.create_chat_completion(ASK, grammar='root ::= "yes"', tools=[WEATHER], max_tokens=4)


def _only(llm, text):
    import numpy as np

    toks = llm.tokenize(text, add_bos=False, special=True)

    def processor(input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[toks[0]] = 0.0
        return out
    return processor


def test_chat_sampler_reports_and_refuses(nc, tiny_llama):
    prompt = nc.ChatPrompt(prompt="", format=0, format_name="test", grammar="root ::= (", grammar_lazy=False)
    from llama_cpp._errors import GrammarError

    with pytest.raises(GrammarError, match="grammar"):
        nc.chat_sampler(tiny_llama.model, prompt.sampler_params())
    lazy = nc.ChatPrompt(prompt="", format=0, format_name="test", grammar='root ::= "a"', grammar_lazy=True)
    with pytest.raises(GrammarError, match="triggers"):
        nc.chat_sampler(tiny_llama.model, lazy.sampler_params())
    with pytest.raises(GrammarError, match="trigger type"):
        nc.chat_sampler(tiny_llama.model, {**lazy.sampler_params(), "grammar_triggers": [{"type": "x", "value": "a"}]})
    none = nc.chat_sampler(tiny_llama.model, nc.ChatPrompt(prompt="", format=0, format_name="t").sampler_params())
    assert none.ptr is None and not none.has_grammar
    made = nc.chat_sampler(tiny_llama.model, {**lazy.sampler_params(), "preserved_tokens": ["<|im_start|>"],
                                              "grammar_triggers": [{"type": "word", "value": "<|im_start|>"},
                                                                   {"type": "word", "value": "a.b"},
                                                                   {"type": "pattern_full", "value": "x+"}]})
    try:
        assert made.trigger_tokens and made.trigger_patterns == ("a\\.b", "^x+$")
        assert made.preserved_token_ids == frozenset(tiny_llama.tokenize(b"<|im_start|>", add_bos=False, special=True))
        assert nc.chat_sampler_state(made.ptr) == {"grammar": "active", "reason": "", "reasoning": "none"}
    finally:
        from llama_cpp._chat.constraint import NativeChatSampler

        NativeChatSampler(made.ptr).close()
    with pytest.raises(ValueError, match="not a sampler"):
        nc.chat_sampler_state(0)


def test_tools_go_to_the_native_layer_only_where_the_model_s_template_knows_tools(nc, monkeypatch):
    from build_tools.fixtures import fixture_path
    from llama_cpp import Llama
    from llama_cpp._chat import native_completion as ncomp

    llm = Llama(model_path=str(fixture_path("llama_bpe")), n_ctx=512, verbose=False)
    try:
        assert ncomp.native_tools_handler(llm) is None  # its ChatML template has no tools: the Python path
        r = llm.create_chat_completion(ASK, tools=[UNIT], tool_choice="get_unit", max_tokens=16, seed=1)
        assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_unit"
        # a model whose template knows tools (a Qwen 3 template standing in for the GGUF's) goes native
        qwen = nc.ChatTemplates(_template("Qwen-Qwen3-0.6B.jinja"))
        monkeypatch.setattr(ncomp.NativeChatHandler, "templates_for", lambda self, llama: qwen)
        monkeypatch.setattr(ncomp, "_FOR_TOOLS", type(ncomp._FOR_TOOLS)())
        assert isinstance(ncomp.native_tools_handler(llm), ncomp.NativeChatHandler)
        seen = {}
        real = ncomp.create_chat_completion
        monkeypatch.setattr(ncomp, "create_chat_completion", lambda *a, **k: seen.update(k) or real(*a, **k))
        r = llm.create_chat_completion(ASK, tools=[UNIT], max_tokens=4, seed=1)
        assert seen["tools"] == [UNIT] and r["object"] == "chat.completion"
        plain = llm.create_chat_completion(ASK, max_tokens=2, seed=1)  # no tools: the Python path, as before
        assert plain["object"] == "chat.completion" and len(seen) and "tool_calls" not in plain["choices"][0]["message"]
        named = Llama(model_path=str(fixture_path("llama_bpe")), n_ctx=256, verbose=False, chat_format="chatml")
        try:
            assert ncomp.native_tools_handler(named) is None  # a named chat_format keeps its own path
        finally:
            named.close()
    finally:
        llm.close()
