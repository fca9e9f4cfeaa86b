"""The Messages API translation (llama_cpp.server.convert.messages), without a model."""

from __future__ import annotations

import json

import pytest

from llama_cpp.server.convert import messages as conv
from llama_cpp.server.errors import APIError


def test_blocks_become_chat_messages():
    msgs = conv.messages_from_request(
        [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}],
        [{"role": "user", "content": "weather?"},
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "look up", "signature": "s"},
             {"type": "text", "text": "Checking."},
             {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Paris"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "sunny"}]},
             {"type": "text", "text": "and tomorrow?"},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert msgs[0] == {"role": "system", "content": "be\nbrief"}
    assert msgs[1] == {"role": "user", "content": "weather?"}
    a = msgs[2]
    assert a["content"] == "Checking." and a["reasoning_content"] == "look up"
    assert a["tool_calls"][0]["id"] == "tu1" and json.loads(a["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "tu1", "content": "sunny"}
    assert msgs[4]["role"] == "user" and msgs[4]["content"][1] == {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}],
     "messages[0].content[0].tool_use_id"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
      {"role": "user", "content": "next"},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "late"}]}],
     "messages[2].content[0].tool_use_id"),
    ([{"role": "system", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "document", "source": {}}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"text": "no type"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}],
     "messages[0].content[0].source"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]}],
     "messages[0].content[0].input"),
])
def test_malformed_blocks_are_400_naming_the_block(messages, param):
    with pytest.raises(APIError) as e:
        conv.messages_from_request(None, messages)
    assert e.value.status == 400 and e.value.param == param


def test_tools_and_tool_choice():
    tools = conv.chat_tools([{"name": "f", "description": "d", "input_schema": {"type": "object"}}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object"}}}]
    assert conv.chat_tool_choice({"type": "any"}, tools) == ("required", None)
    assert conv.chat_tool_choice({"type": "auto", "disable_parallel_tool_use": True}, tools) == ("auto", False)
    assert conv.chat_tool_choice({"type": "none"}, tools) == ("none", None)
    assert conv.chat_tool_choice({"type": "tool", "name": "f"}, tools)[0] == {"type": "function",
                                                                               "function": {"name": "f"}}
    with pytest.raises(APIError, match="not among the tools"):
        conv.chat_tool_choice({"type": "tool", "name": "g"}, tools)
    with pytest.raises(APIError):
        conv.chat_tool_choice({"type": "sometimes"}, tools)
    with pytest.raises(APIError, match="client tools"):
        conv.chat_tools([{"type": "web_search_20250305", "name": "web_search"}])


@pytest.mark.parametrize("finish, stop, reason", [
    ("tool_calls", None, "tool_use"), ("length", None, "max_tokens"), ("stop", None, "end_turn"),
    ("stop", "END", "stop_sequence")])
def test_stop_reasons(finish, stop, reason):
    assert conv.stop_reason(finish, stop) == reason


def test_message_from_a_chat_completion():
    chat = {"id": "c", "created": 1, "model": "m", "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                                              "prompt_tokens_cached": 3},
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "ok", "reasoning_content": "hm",
                "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}
    m = conv.message(chat)
    assert m["type"] == "message" and m["stop_reason"] == "tool_use" and m["stop_sequence"] is None
    assert m["content"] == [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "ok"},
                            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]
    assert m["usage"] == {"input_tokens": 6, "output_tokens": 4, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 3}


def _chunk(delta=None, finish=None, usage=None, stop=None):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    if stop:
        choice["stop_sequence"] = stop
    c = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    if usage:
        c["usage"] = usage
    return c


def test_stream_events():
    ev = conv.MessageEvents("m", 7)
    out = ev.start()
    for c in [_chunk({"role": "assistant"}), _chunk({"reasoning_content": "hm"}), _chunk({"content": "Hi"}),
              _chunk({"tool_calls": [{"index": 0, "id": "t1", "type": "function", "function": {"name": "f"}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
              _chunk(finish="tool_calls", usage={"prompt_tokens": 7, "completion_tokens": 5})]:
        out += ev.chunk(c)
    out += ev.finish_events()
    kinds = [(e["type"], (e.get("delta") or e.get("content_block") or {}).get("type")) for e in out]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", "thinking"), ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"), ("content_block_stop", None),
        ("content_block_start", "text"), ("content_block_delta", "text_delta"), ("content_block_stop", None),
        ("content_block_start", "tool_use"), ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"), ("content_block_stop", None),
        ("message_delta", None), ("message_stop", None)]
    assert out[0]["message"]["usage"]["input_tokens"] == 7
    assert [e["index"] for e in out if "index" in e] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert out[8]["content_block"] == {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    assert out[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2]["usage"]["output_tokens"] == 5
    stopped = conv.MessageEvents("m")
    tail = stopped.chunk(_chunk({"content": "a"})) + stopped.chunk(_chunk(finish="stop", stop="END"))
    assert stopped.finish_events()[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert tail[0]["type"] == "content_block_start"
