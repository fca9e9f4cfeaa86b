"""Chat: the GGUF template in a sandbox, named formats, streaming == non-streaming, JSON/tool grammars."""

from __future__ import annotations

import json

import pytest

from llama_cpp import Llama, TemplateError
from llama_cpp.llama_chat_format import Jinja2ChatFormatter, chat_format_names, get_chat_formatter

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def llm(spm_model):
    with Llama(spm_model, n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False) as m:
        yield m


def test_uses_the_gguf_template(llm):
    template = llm.model.chat_template()
    assert template and "<|im_start|>" in template
    expected = Jinja2ChatFormatter(template)(messages=MESSAGES).prompt
    assert expected.endswith("<|im_start|>assistant\n")
    r = llm.create_chat_completion(MESSAGES, max_tokens=8, temperature=0)
    n_prompt = len(llm.tokenize(expected.encode(), add_bos=False, special=True))
    assert r["usage"]["prompt_tokens"] == n_prompt
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    # the same prompt as a plain completion gives the same greedy text
    plain = llm(llm.tokenize(expected.encode(), add_bos=False, special=True), max_tokens=8, temperature=0,
                stop=["<|im_end|>"])
    assert r["choices"][0]["message"]["content"] == plain["choices"][0]["text"]


def test_stream_equals_non_stream(llm):
    full = llm.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)
    chunks = list(llm.create_chat_completion(MESSAGES, max_tokens=16, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_named_chat_formats(spm_model):
    with Llama(spm_model, n_ctx=256, n_threads=1, chat_format="gemma", verbose=False) as g:
        r = g.create_chat_completion(MESSAGES, max_tokens=4, temperature=0)
        assert r["usage"]["completion_tokens"] <= 4
    with pytest.raises(ValueError, match="unknown chat_format"):
        Llama(spm_model, n_ctx=256, n_threads=1, chat_format="no-such-format", verbose=False)
    assert {"chatml", "llama-2", "gemma"} <= set(chat_format_names())
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"}]
    assert get_chat_formatter("chatml")(messages=msgs).prompt == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n")
    assert get_chat_formatter("llama-2", bos_token="<s>", eos_token="</s>")(messages=msgs).prompt == (
        "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nQ [/INST] A </s><s>[INST] Q2 [/INST]")
    assert get_chat_formatter("gemma", bos_token="<bos>")(messages=msgs).prompt == (
        "<bos><start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
        "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ cycler.__init__.__globals__.os.system('true') }}",
    "{% set _ = messages.append({'role': 'x'}) %}",
    "{{ raise_exception('bad role') }}",
    "{% for %}",
])
def test_hostile_or_broken_templates_raise(template):
    with pytest.raises(TemplateError):
        Jinja2ChatFormatter(template)(messages=MESSAGES)


def test_template_helpers():
    f = Jinja2ChatFormatter("{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}")
    out = f(messages=[{"role": "user", "content": "é"}]).prompt
    assert out == '{"role": "user", "content": "é"}|4'


def test_bad_messages_rejected(llm):
    with pytest.raises(ValueError, match="non-empty list"):
        llm.create_chat_completion([])
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        llm.create_chat_completion([{"content": "no role"}])


def test_json_response_format(llm):
    r = llm.create_chat_completion(MESSAGES, max_tokens=80, temperature=0.7, seed=1,
                                   response_format={"type": "json_object", "schema": {
                                       "type": "object", "properties": {"ok": {"type": "boolean"}},
                                       "required": ["ok"]}})
    content = r["choices"][0]["message"]["content"]
    if r["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content)["ok"], bool)
    else:
        assert content.startswith("{")


def test_named_tool_choice_returns_tool_call(llm):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}]
    r = llm.create_chat_completion(MESSAGES, tools=tools, max_tokens=40, temperature=0,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_time"
    assert json.loads(call["arguments"])["zone"] in ("utc", "cet")
