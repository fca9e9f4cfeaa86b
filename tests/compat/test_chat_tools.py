"""``chatml-function-calling`` and ``functionary`` as llama-cpp-python's handlers: their prompts, and
tool calls on a fixture model (arguments constrained by the tool's JSON schema)."""

from __future__ import annotations

import json

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import llama_cpp.llama_chat_format as lcf
from llama_cpp import Llama
from llama_cpp._chat.tools import (
    CHATML_FUNCTION_CALLING_TEMPLATE,
    functionary_prompt,
    render_chatml_function_calling,
    typescript_namespace,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8, "description": "the <city>"},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
MESSAGES = [{"role": "system", "content": "Be <brief> & exact."}, {"role": "user", "content": "Weather in Paris?"}]


def test_chatml_function_calling_prompt_is_upstreams():
    # upstream renders this template with HTML autoescaping and StrictUndefined
    reference = ImmutableSandboxedEnvironment(autoescape=jinja2.select_autoescape(["html", "xml"]),
                                              undefined=jinja2.StrictUndefined)
    template = reference.from_string(CHATML_FUNCTION_CALLING_TEMPLATE)
    for tools, flag in (([], None), (TOOLS, True)):
        expected = template.render(messages=MESSAGES, tools=tools, tool_calls=flag, add_generation_prompt=True)
        assert render_chatml_function_calling(MESSAGES, tools, bool(flag)) == expected
    assert "&lt;brief&gt; &amp; exact." in expected and "functions.get_weather:\n{" in expected


def test_functionary_prompt():
    ns = typescript_namespace([TOOLS[0]["function"]])
    assert ns == ("// Supported function definitions that should be called when necessary.\n"
                  "namespace functions {\n\n"
                  "  // Weather of a city\n  type get_weather = (_: {\n"
                  "    // the <city>\n    city: string,\n"
                  "    // \n    unit: \"c\" | \"f\",\n"
                  "  }) => any;\n\n} // namespace functions\n")
    prompt = functionary_prompt([{"role": "user", "content": "hi"}], [TOOLS[0]["function"]])
    assert prompt == (f"system:\n{ns}\nsystem:\n"
                      "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                      "helpful, detailed, and polite answers to the user's questions. The assistant calls functions "
                      "with appropriate input when necessary\nuser:\n</s>hi</s>\nassistant")


@pytest.fixture(scope="module")
def llm():
    from build_tools.fixtures import fixture_path

    with Llama(str(fixture_path("llama_spm")), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False) as m:
        yield m


def _args(call):
    args = json.loads(call["function"]["arguments"])
    assert isinstance(args["city"], str) and len(args["city"]) <= 8 and args["unit"] in ("c", "f")
    return args


def test_chatml_function_calling_named_tool(llm):
    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = handler(llama=llm, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0)
    msg = r["choices"][0]["message"]
    assert r["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
    assert msg["tool_calls"][0]["id"].startswith("call__0_get_weather_")
    _args(msg["tool_calls"][0])
    assert msg["function_call"]["arguments"] == msg["tool_calls"][0]["function"]["arguments"]
    # streamed, the argument pieces join to the same arguments
    chunks = list(handler(llama=llm, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=80,
                          temperature=0, stream=True))
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    pieces = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                     for c in chunks[1:-1])
    assert pieces == msg["tool_calls"][0]["function"]["arguments"]


def test_chatml_function_calling_legacy_functions(llm):
    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    r = handler(llama=llm, messages=MESSAGES, functions=[TOOLS[0]["function"]],
                function_call={"name": "get_weather"}, max_tokens=80, temperature=0)
    assert r["choices"][0]["message"]["function_call"]["name"] == "get_weather"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chatml_function_calling_auto(llm, seed):
    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    r = handler(llama=llm, messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=48, temperature=1.0,
                seed=seed)
    msg = r["choices"][0]["message"]
    if msg.get("tool_calls"):
        assert r["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
        for i, call in enumerate(msg["tool_calls"]):
            assert call["function"]["name"] in ("get_weather", "noop")
            assert call["id"].startswith(f"call__{i}_{call['function']['name']}_")
            if call["function"]["name"] == "get_weather":
                _args(call)
        assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    else:
        assert isinstance(msg["content"], str) and r["choices"][0]["finish_reason"] in ("stop", "length")


def test_chatml_function_calling_required_always_calls(llm):
    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    r = handler(llama=llm, messages=MESSAGES, tools=TOOLS[:1], tool_choice="required", max_tokens=60, temperature=0)
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_chatml_function_calling_without_tools_is_a_message(llm):
    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    r = handler(llama=llm, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert r["object"] == "chat.completion" and isinstance(r["choices"][0]["message"]["content"], str)
    r = handler(llama=llm, messages=MESSAGES, max_tokens=60, temperature=0.5, seed=1,
                response_format={"type": "json_object", "schema": {"type": "object", "properties": {
                    "ok": {"type": "boolean"}}, "required": ["ok"]}})
    assert isinstance(json.loads(r["choices"][0]["message"]["content"])["ok"], bool)
    with pytest.raises(ValueError, match="unsupported tool_choice"):
        handler(llama=llm, messages=MESSAGES, tools=TOOLS, tool_choice="sometimes")


def test_functionary_named_call(llm):
    handler = lcf.get_chat_completion_handler("functionary")
    r = handler(llama=llm, messages=MESSAGES[1:], tools=TOOLS, max_tokens=80, temperature=0,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r["choices"][0]["message"]
    assert msg["function_call"]["name"] == "get_weather" and msg["tool_calls"][0]["id"] == "get_weather"
    _args(msg["tool_calls"][0])
    r = handler(llama=llm, messages=MESSAGES[1:], tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert "tool_calls" not in r["choices"][0]["message"]


def test_functionary_v2_needs_the_hf_tokenizer(llm):
    handler = lcf.get_chat_completion_handler("functionary-v2")
    with pytest.raises(ValueError, match="LlamaHFTokenizer"):
        handler(llama=llm, messages=MESSAGES, tools=TOOLS)


class _StubHFTokenizer:
    """Stands in for a functionary tokenizer's chat template (the v2 layout)."""

    def __init__(self, v1: bool = False) -> None:
        self.additional_special_tokens = ["<|START_OF_FUNCTION_CALL|>"] if v1 else ["<|recipient|>"]
        self.seen: list = []

    def apply_chat_template(self, messages, tokenize=False):
        self.seen = messages
        return "".join(f"<|from|>{m['role']}\n<|recipient|>all\n<|content|>{m.get('content')}\n" for m in messages)


def _with_tokenizer(llm, hf):
    import types

    return types.SimpleNamespace(create_completion=llm.create_completion, model=llm.model,
                                 tokenize=llm.tokenize, model_path=llm.model_path,
                                 tokenizer_=types.SimpleNamespace(hf_tokenizer=hf))


@pytest.mark.parametrize("v1", [False, True])
def test_functionary_v1_v2_with_the_models_tokenizer(llm, v1):
    hf = _StubHFTokenizer(v1)
    handler = lcf.get_chat_completion_handler("functionary-v1" if v1 else "functionary-v2")
    llama = _with_tokenizer(llm, hf)
    r = handler(llama=llama, messages=MESSAGES[1:], tools=TOOLS, max_tokens=60, temperature=0,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    # the tools reach the template as the TypeScript namespace, then the fixed system prompt
    assert hf.seen[0]["role"] == "system" and "type get_weather = (_: {" in hf.seen[0]["content"]
    assert hf.seen[1]["content"].startswith("A chat between a curious user")
    call = r["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and r["choices"][0]["finish_reason"] == "tool_calls"
    _args(call)
    r = handler(llama=llama, messages=MESSAGES[1:], tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert isinstance(r["choices"][0]["message"]["content"], str)
    assert "type get_weather" not in hf.seen[0]["content"]  # tool_choice none hides the tools


@pytest.mark.parametrize("v1", [False, True])
@pytest.mark.parametrize("seed", [0, 3])
def test_functionary_v1_v2_auto(llm, seed, v1):
    handler = lcf.get_chat_completion_handler("functionary-v1" if v1 else "functionary-v2")
    r = handler(llama=_with_tokenizer(llm, _StubHFTokenizer(v1)), messages=MESSAGES[1:], tools=TOOLS,
                max_tokens=40, temperature=1.0, seed=seed)
    msg = r["choices"][0]["message"]
    for call in msg.get("tool_calls") or []:
        assert call["function"]["name"] in ("get_weather", "noop")
    assert msg.get("tool_calls") or isinstance(msg["content"], str)


def test_handlers_through_llama_dispatch():
    from build_tools.fixtures import fixture_path

    handler = lcf.get_chat_completion_handler("chatml-function-calling")
    with Llama(str(fixture_path("llama_spm")), n_ctx=2048, n_threads=1, chat_handler=handler, verbose=False) as m:
        r = m.create_chat_completion(MESSAGES, tools=TOOLS, max_tokens=60, temperature=0,
                                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
        _args(r["choices"][0]["message"]["tool_calls"][0])
        r = m.create_chat_completion(MESSAGES, max_tokens=3, temperature=0)
        assert isinstance(r["choices"][0]["message"]["content"], str)


def test_handler_only_chat_format_names_work_in_the_constructor(spm_model):
    from llama_cpp import Llama
    from llama_cpp import llama_chat_format as chat

    with Llama(spm_model, n_ctx=256, n_threads=1, verbose=False, chat_format="chatml-function-calling") as llm:
        assert llm.chat_handler is chat.chat_handler_for_format("chatml-function-calling")
        out = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
        assert out["choices"][0]["message"]["role"] == "assistant"
    with pytest.raises(ValueError):
        Llama(spm_model, n_ctx=64, verbose=False, chat_format="no-such-format")
