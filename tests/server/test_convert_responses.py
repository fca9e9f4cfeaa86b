"""The Responses API translation (llama_cpp.server.convert.responses), without a model."""

from __future__ import annotations

import types

import pytest

from llama_cpp.server.convert import responses as conv
from llama_cpp.server.errors import APIError


def _body(**kw):
    base = dict(model=None, input="hi", instructions=None, tools=None, tool_choice=None, parallel_tool_calls=None,
                max_output_tokens=None, temperature=None, top_p=None, text=None, reasoning=None, stream=False,
                store=None, previous_response_id=None, metadata=None, seed=None, user=None)
    return types.SimpleNamespace(**{**base, **kw})


def test_input_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"},
                                                        {"type": "input_text", "text": "in Paris"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "look up"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
    ]
    msgs = conv.messages_from_input(items, "you are a bot")
    assert msgs[0] == {"role": "system", "content": "you are a bot"}
    assert msgs[1] == {"role": "system", "content": "be brief"}
    assert msgs[2] == {"role": "user", "content": "weather?\nin Paris"}
    call = msgs[3]
    assert call["role"] == "assistant" and call["content"] is None and call["reasoning_content"] == "look up"
    assert [c["id"] for c in call["tool_calls"]] == ["c1", "c2"]
    assert call["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert msgs[4] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert msgs[5] == {"role": "tool", "tool_call_id": "c2", "content": "noon"}
    assert msgs[6]["content"] == [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    assert conv.messages_from_input("hello", None) == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("items, param", [
    ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "input[0].call_id"),
    ([{"type": "web_search_call"}], "input[0].type"),
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0]"),
    ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "input[0].content[0]"),
    (["just a string"], "input[0]"),
    ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0]"),
])
def test_malformed_items_are_400_naming_the_item(items, param):
    with pytest.raises(APIError) as e:
        conv.messages_from_input(items, None)
    assert e.value.status == 400 and e.value.param == param


def test_tools_tool_choice_and_text_format():
    tools = conv.chat_tools([{"type": "function", "name": "f", "description": "d",
                              "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    assert conv.chat_tool_choice({"type": "function", "name": "f"}, tools) == {"type": "function",
                                                                                "function": {"name": "f"}}
    assert conv.chat_tool_choice("required", tools) == "required"
    with pytest.raises(APIError, match="not among the tools"):
        conv.chat_tool_choice({"type": "function", "name": "g"}, tools)
    with pytest.raises(APIError, match="function tools only"):
        conv.chat_tools([{"type": "web_search"}])
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert conv.response_format({"format": {"type": "json_schema", "name": "o", "schema": schema}}) == {
        "type": "json_schema", "json_schema": {"name": "o", "schema": schema, "strict": None}}
    assert conv.response_format({"format": {"type": "text"}}) is None
    with pytest.raises(APIError):
        conv.response_format({"format": {"type": "xml"}})


def test_chat_request_maps_limits_and_continues_a_history():
    kw = conv.chat_request(_body(max_output_tokens=7, temperature=0.0, top_p=0.5, reasoning={"effort": "low"}))
    assert kw["max_tokens"] == 7 and kw["temperature"] == 0.0 and kw["top_p"] == 0.5
    assert kw["reasoning_effort"] == "low" and kw["messages"] == [{"role": "user", "content": "hi"}]
    assert "temperature" not in conv.chat_request(_body())
    # a stored conversation (a previous response's input and output items) comes before the new input
    history = [{"type": "message", "role": "user", "content": "hello"},
               {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}]
    kw = conv.chat_request(_body(input=[{"type": "function_call_output", "call_id": "c1", "output": "7"}]), history)
    assert [m["role"] for m in kw["messages"]] == ["user", "assistant", "tool"]
    with pytest.raises(APIError) as e:  # errors name the new input's items, past the history
        conv.chat_request(_body(input=[{"type": "computer_call"}]), history)
    assert e.value.param == "input[0].type"


def _chat(message, finish="stop"):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_cached": 2}}


def test_response_items_from_a_chat_completion():
    msg = {"role": "assistant", "content": "ok", "reasoning_content": "hm",
           "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    r = conv.response(_body(), _chat(msg, "tool_calls"), count=len)
    assert r["object"] == "response" and r["status"] == "completed" and r["store"] is False
    assert [o["type"] for o in r["output"]] == ["reasoning", "message", "function_call"]
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "hm"}]
    assert r["output"][1]["content"][0]["text"] == "ok"
    assert r["output"][2]["call_id"] == "c9" and r["output"][2]["name"] == "f"
    assert r["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                          "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 8}
    cut = conv.response(_body(), _chat({"role": "assistant", "content": "o"}, "length"))
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _chunk(delta=None, finish=None, usage=None):
    c = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return c


def test_stream_events_follow_the_official_sequence():
    ev = conv.ResponseEvents(_body(), "m", count=len)
    out = ev.start()
    for c in [_chunk({"role": "assistant"}), _chunk({"reasoning_content": "th"}), _chunk({"reasoning_content": "ink"}),
              _chunk({"content": "Hel"}), _chunk({"content": "lo"}),
              _chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
              _chunk({"tool_calls": [{"index": 1, "id": "c2", "type": "function",
                                      "function": {"name": "g", "arguments": "{}"}}]}),
              _chunk(finish="tool_calls", usage={"prompt_tokens": 4, "completion_tokens": 9})]:
        out += ev.chunk(c)
    out += ev.finish()
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert out[0]["response"]["status"] == "in_progress" and out[0]["response"]["output"] == []
    assert out[2]["item"]["content"] == [] and out[2]["item"]["status"] == "in_progress"
    assert out[13]["text"] == "Hello" and out[6]["text"] == "think"
    assert out[19]["arguments"] == '{"a": 1}' and out[19]["name"] == "f"
    final = out[-1]["response"]
    assert final["status"] == "completed" and [o["type"] for o in final["output"]] == [
        "reasoning", "message", "function_call", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hello" and final["output"][3]["call_id"] == "c2"
    assert final["usage"]["input_tokens"] == 4 and final["usage"]["output_tokens"] == 9
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 5


def test_stream_at_the_token_limit_ends_incomplete():
    ev = conv.ResponseEvents(_body(), "m")
    out = ev.start() + ev.chunk(_chunk({"content": "a"})) + ev.chunk(_chunk(finish="length")) + ev.finish()
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
