"""llama-server's chat-layer fields on ``/v1/chat/completions`` (and their model-settings defaults):
``chat_template_kwargs``, ``reasoning_format``, ``reasoning_budget_tokens``, driven with the official
``openai`` client on a tiny model carrying Qwen 3's template (thinking, tools)."""

from __future__ import annotations

import httpx
import pytest

UNIT = {"type": "function", "function": {"name": "get_unit", "description": "Pick a unit", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]}}}
ASK = [{"role": "user", "content": "Which unit?"}]
THOUGHT = "<think>\nPick one.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "get_unit", "arguments": {"unit": "f"}}\n</tool_call>'


@pytest.fixture(scope="module")
def srv(start_server, thinking_path):
    return start_server([{"model": str(thinking_path), "model_alias": "think", "n_parallel": 2, "n_ctx": 1024},
                         {"model": str(thinking_path), "model_alias": "quiet", "n_parallel": 1, "n_ctx": 1024,
                          "chat_template_kwargs": {"enable_thinking": False}}],
                        max_tokens_limit=200)


def _prompt_tokens(srv, model: str, **extra) -> int:
    r = srv.client().chat.completions.create(model=model, messages=ASK, max_tokens=1, temperature=0,
                                             extra_body=extra or None)
    return r.usage.prompt_tokens


def test_chat_template_kwargs_per_request_and_per_model(srv):
    plain = _prompt_tokens(srv, "think")
    # Qwen 3's template closes an empty thinking block in the generation prompt when thinking is off
    off = _prompt_tokens(srv, "think", chat_template_kwargs={"enable_thinking": False})
    assert off > plain
    assert _prompt_tokens(srv, "quiet") == off  # the model's settings give the default
    assert _prompt_tokens(srv, "quiet", chat_template_kwargs={"enable_thinking": True}) == plain  # merged over it


def test_reasoning_format_decides_where_the_thinking_goes(srv, script):
    client = srv.client()
    script(srv, "think", THOUGHT + "Celsius.")
    # a chat without tools or chat-layer options keeps upstream's template path; asking for a format
    # routes it through llama.cpp's chat layer, as a chat with tools is
    parsed = client.chat.completions.create(model="think", messages=ASK, max_tokens=50, temperature=0,
                                            extra_body={"reasoning_format": "auto"})
    msg = parsed.choices[0].message
    assert msg.content == "Celsius." and msg.model_extra["reasoning_content"].strip() == "Pick one."
    script(srv, "think", THOUGHT + "Celsius.")
    raw = client.chat.completions.create(model="think", messages=ASK, max_tokens=50, temperature=0,
                                         extra_body={"reasoning_format": "none"})
    assert "<think>" in raw.choices[0].message.content and not raw.choices[0].message.model_extra.get(
        "reasoning_content")


def test_tool_call_and_reasoning_through_the_openai_client(srv, script):
    client = srv.client()
    script(srv, "think", THOUGHT + CALL)
    r = client.chat.completions.create(model="think", messages=ASK, tools=[UNIT], max_tokens=100, temperature=0,
                                       extra_body={"thinking_budget_tokens": 50})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_unit" and call.function.arguments.replace(" ", "") == '{"unit":"f"}'
    assert choice.message.model_extra["reasoning_content"].strip() == "Pick one."
    # streamed, the deltas add up to the same message
    script(srv, "think", THOUGHT + CALL)
    chunks = list(client.chat.completions.create(model="think", messages=ASK, tools=[UNIT], max_tokens=100,
                                                 temperature=0, stream=True))
    args = "".join(tc.function.arguments or "" for c in chunks for tc in (c.choices[0].delta.tool_calls or []))
    assert args.replace(" ", "") == '{"unit":"f"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("extra, named", [
    ({"reasoning_format": "bogus"}, "reasoning_format"),
    ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"reasoning_budget_tokens": -5}, "reasoning_budget_tokens"),
])
def test_bad_values_are_400_naming_the_field(srv, extra, named):
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "think", "messages": ASK, "max_tokens": 1,
                                                           **extra}, timeout=60)
    assert r.status_code in (400, 422), r.text
    assert named in r.text


def test_model_settings_refuse_a_bad_reasoning_format(thinking_path):
    from llama_cpp.server.settings import ModelSettings

    with pytest.raises(ValueError, match="reasoning_format"):
        ModelSettings(model=str(thinking_path), reasoning_format="bogus")


@pytest.fixture(scope="module")
def preserving(start_server, tmp_path_factory):
    """Qwen 3's template on a vocabulary where its preserved tokens are control tokens (one token each, as
    in the real model's vocabulary): the slots must detokenize them as text for the chat parser."""
    from tests.chat.forcing import model_with_template
    from tests.server.conftest import TEMPLATES

    path = model_with_template(tmp_path_factory.mktemp("preserving") / "qwen3-control.gguf",
                               (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(),
                               ["<tool_call>", "</tool_call>", "<think>", "</think>"])
    return start_server([{"model": str(path), "model_alias": "ctl", "n_parallel": 2, "n_ctx": 1024}],
                        max_tokens_limit=200)


def test_slots_render_preserved_tokens_as_text_for_the_parser(preserving, script):
    engine = preserving.engine("ctl")
    (single,) = engine.model.tokenize(b"<tool_call>", add_special=False, parse_special=True)
    assert engine.model.token_to_piece(single) == b""  # a control token: hidden unless asked for
    script(preserving, "ctl", THOUGHT + CALL)
    r = preserving.client().chat.completions.create(model="ctl", messages=ASK, tools=[UNIT], max_tokens=100,
                                                    temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls[0].function.name == "get_unit"
    assert msg.model_extra["reasoning_content"].strip() == "Pick one." and not msg.content


def test_tools_over_the_bounds_are_400_naming_the_tool(srv):
    too_many = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(129)]
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "think", "messages": ASK, "tools": too_many},
                   timeout=60)
    assert r.status_code == 400 and "at most 128" in r.json()["error"]["message"]
    unnamed = [{"type": "function", "function": {"name": "has space", "parameters": {"type": "object"}}}]
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "think", "messages": ASK, "tools": unnamed},
                   timeout=60)
    assert r.status_code == 400 and "has space" in r.json()["error"]["message"]


def test_llama_refuses_the_same_tools(srv):
    llm = srv.app.state.registry.get("think").llama
    with pytest.raises(ValueError, match="used twice"):
        llm.create_chat_completion(ASK, tools=[UNIT, UNIT], max_tokens=1)
