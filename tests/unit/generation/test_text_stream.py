"""The generation engine's text layer (no native library): UTF-8 holding, stop strings, responses."""

from __future__ import annotations

from llama_cpp._generation.loop import TextStream, held_suffix, utf8_complete_len
from llama_cpp._generation.responses import chat_response, chat_stream, join_chunks


def test_utf8_complete_len_holds_a_partial_sequence():
    euro = "€".encode()  # 3 bytes
    assert utf8_complete_len(b"ab" + euro) == 5
    assert utf8_complete_len(b"ab" + euro[:2]) == 2
    assert utf8_complete_len(b"ab" + euro[:1]) == 2
    assert utf8_complete_len(b"") == 0


def test_held_suffix_is_the_longest_stop_prefix():
    assert held_suffix(b"hello wor", [b"world", b"or"]) == 3
    assert held_suffix(b"hello", [b"xyz"]) == 0


def test_text_stream_sends_safe_bytes_and_cuts_at_the_first_stop():
    s = TextStream(["STOP", "ST!"])
    assert s.push(b"ab") == b"ab"
    assert s.push(b"cS") == b"c"  # "S" could begin a stop string
    assert s.push(b"T") == b""
    assert s.push(b"!x") == b"" and s.stopped
    assert s.rest() == b""  # the text ends where "ST!" begins
    t = TextStream([])
    euro = "€".encode()
    assert t.push(euro[:1]) == b"" and t.push(euro[1:]) == euro


def test_text_stream_never_matches_a_stop_inside_the_echoed_head():
    s = TextStream(["end"], head=b"the end: ")
    assert s.push(b"more") == b"the end: mor" and not s.stopped  # "e" may begin "end"


def _chunk(text, finish=None, **extra):
    c = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
         "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    c.update(extra)
    return c


def test_chat_views_of_completion_chunks():
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    parts = [_chunk("he"), _chunk("llo", "stop", usage=usage)]
    joined = join_chunks(parts)
    assert joined["choices"][0]["text"] == "hello" and joined["usage"] == usage
    msg = chat_response(joined)["choices"][0]
    assert msg["message"] == {"role": "assistant", "content": "hello"} and msg["finish_reason"] == "stop"
    stream = list(chat_stream(iter(parts)))
    assert [c["choices"][0]["delta"] for c in stream] == [{"role": "assistant"}, {"content": "he"},
                                                          {"content": "llo"}, {}]
    assert stream[-1]["usage"] == usage and stream[-1]["choices"][0]["finish_reason"] == "stop"
    tool = list(chat_stream(iter(parts), tool_name="f"))
    assert tool[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chat_response(joined, "f")["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "hello"


def _accumulate(stream):
    """A streamed tool call assembled as the openai client does: strings of one index concatenate."""
    calls: dict[int, dict] = {}
    for c in stream:
        for d in c["choices"][0]["delta"].get("tool_calls") or []:
            acc = calls.setdefault(d["index"], {"function": {}})
            for k in ("id", "type"):
                if k in d:
                    acc[k] = acc.get(k, "") + d[k]
            for k, v in d.get("function", {}).items():
                acc["function"][k] = acc["function"].get(k, "") + v
    return [calls[i] for i in sorted(calls)]


def test_a_streamed_forced_tool_call_assembles_to_the_non_streamed_one():
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    parts = [_chunk('{"a"'), _chunk(": 1"), _chunk("}", "stop", usage=usage)]
    whole = chat_response(join_chunks(parts), "f")["choices"][0]["message"]
    assert whole["function_call"] == {"name": "f", "arguments": '{"a": 1}'}
    (call,) = _accumulate(chat_stream(iter(parts), tool_name="f"))
    assert call == whole["tool_calls"][0]
    assert call["id"] == "call__0_f_cmpl-1"
