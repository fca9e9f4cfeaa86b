"""``/v1/messages`` driven with the official ``anthropic`` client on a real tiny model whose template
knows tools (Qwen 2.5's; Qwen 3's for thinking): text, stop sequences, streaming, tool_use → tool_result,
count_tokens, keys. Where a test needs a call or thinking the model's answer is scripted (``script``)."""

from __future__ import annotations

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")

UNIT = {"name": "get_unit", "description": "Pick a unit",
        "input_schema": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                         "required": ["unit"]}}
HELLO = [{"role": "user", "content": "Hello there"}]
# greedy: sampling fields as raw body fields (newer clients dropped temperature from their signature)
GREEDY = {"temperature": 0}


CALL = '<tool_call>\n{"name": "get_unit", "arguments": {"unit": "f"}}\n</tool_call>'


@pytest.fixture(scope="module")
def agent(start_server, tools_path, thinking_path):
    return start_server([{"model": str(tools_path), "model_alias": "tools", "n_parallel": 2, "n_ctx": 1024},
                         {"model": str(thinking_path), "model_alias": "think", "n_parallel": 1, "n_ctx": 1024}],
                        max_tokens_limit=300, api_key="sk-test")


def _client(agent, key="sk-test"):
    return anthropic.Anthropic(base_url=agent.url, api_key=key, max_retries=0, timeout=120)


def test_plain_message_and_stop_reasons(agent):
    client = _client(agent)
    m = client.messages.create(model="tools", max_tokens=12, messages=HELLO, extra_body=GREEDY,
                               system="Answer briefly.")
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    text = m.content[0].text
    assert text and m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens > 0
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 12
    # a stop sequence taken from the greedy answer ends it there, and is named
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if stop.strip() and stop not in text[:len(text) // 2]:
        s = client.messages.create(model="tools", max_tokens=12, messages=HELLO, extra_body=GREEDY,
                                   system="Answer briefly.", stop_sequences=[stop])
        assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop
        assert s.content[0].text == text[:text.index(stop)]


def test_streaming_events(agent):
    client = _client(agent)
    with client.messages.stream(model="tools", max_tokens=8, messages=HELLO, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert deltas and all(e.delta.type == "text_delta" for e in deltas)
    plain = client.messages.create(model="tools", max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert final.content[0].text == "".join(e.delta.text for e in deltas) == plain.content[0].text
    assert final.stop_reason == plain.stop_reason and final.usage.output_tokens == plain.usage.output_tokens


def test_tool_use_then_tool_result(agent, script):
    client = _client(agent)
    ask = [{"role": "user", "content": "Which unit?"}]
    script(agent, "tools", CALL)
    m = client.messages.create(model="tools", max_tokens=200, messages=ask, tools=[UNIT],
                               tool_choice={"type": "any"}, extra_body=GREEDY)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.name == "get_unit" and use.input == {"unit": "f"} and use.id
    follow = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "fahrenheit"}]}]
    script(agent, "tools", "Fahrenheit it is.")
    m2 = client.messages.create(model="tools", max_tokens=50, messages=follow, tools=[UNIT])
    assert m2.stop_reason == "end_turn" and m2.content[0].text == "Fahrenheit it is."
    n = client.messages.count_tokens(model="tools", messages=follow, tools=[UNIT]).input_tokens
    assert n == m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0)
    assert n > m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    # streamed: the call arrives as input_json_delta pieces that the client assembles
    script(agent, "tools", CALL)
    with client.messages.stream(model="tools", max_tokens=200, messages=ask, tools=[UNIT],
                                tool_choice={"type": "tool", "name": "get_unit"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events]
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].input == {"unit": "f"} and final.content[0].name == "get_unit"


def test_thinking_blocks(agent, script):
    client = _client(agent)
    answer = "<think>\nPick one.\n</think>\n\n" + CALL
    script(agent, "think", answer)
    m = client.messages.create(model="think", max_tokens=200, messages=[{"role": "user", "content": "Unit?"}],
                               tools=[UNIT], thinking={"type": "enabled", "budget_tokens": 100})
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking.strip() == "Pick one." and m.stop_reason == "tool_use"
    script(agent, "think", answer)
    with client.messages.stream(model="think", max_tokens=200, messages=[{"role": "user", "content": "Unit?"}],
                                tools=[UNIT], thinking={"type": "enabled", "budget_tokens": 100}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(getattr(getattr(e, "delta", None), "type", None) == "thinking_delta" for e in events)
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == m.content[0].thinking and final.content[1].input == {"unit": "f"}


def test_count_tokens_matches_the_prompt(agent):
    client = _client(agent)
    n = client.messages.count_tokens(model="tools", messages=HELLO, system="Answer briefly.").input_tokens
    m = client.messages.create(model="tools", max_tokens=1, messages=HELLO, system="Answer briefly.")
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) and n > 3
    with_tools = client.messages.count_tokens(model="tools", messages=HELLO, tools=[UNIT]).input_tokens
    assert with_tools > client.messages.count_tokens(model="tools", messages=HELLO).input_tokens


def test_keys_and_errors_in_anthropic_shape(agent):
    with pytest.raises(anthropic.AuthenticationError) as e:
        _client(agent, "wrong").messages.create(model="tools", max_tokens=4, messages=HELLO)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
    bad = [
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]},
         "tool_use_id"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "video"),
        ({"messages": HELLO, "tools": [UNIT], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "no projector"),
    ]
    for body, needle in bad:
        with pytest.raises(anthropic.BadRequestError) as e:
            _client(agent).messages.create(model="tools", max_tokens=4, **body)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        assert needle in e.value.body["error"]["message"]
    r = httpx.post(agent.url + "/v1/messages", headers={"x-api-key": "sk-test"}, json={"messages": HELLO})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"  # no max_tokens
    assert "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(agent.url + "/v1/messages", headers={"x-api-key": "sk-test"}, json={
        "model": "nope", "max_tokens": 1, "messages": HELLO})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # the OpenAI routes keep OpenAI's shape, and take the key from x-api-key too
    r = httpx.post(agent.url + "/v1/chat/completions", headers={"x-api-key": "sk-test"},
                   json={"model": "tools", "messages": HELLO, "max_tokens": 1})
    assert r.status_code == 200
    r = httpx.post(agent.url + "/v1/chat/completions", json={"model": "tools", "messages": HELLO})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
