"""``/v1/responses`` driven with the official ``openai`` client (Responses API) on a real tiny model whose
template knows tools (Qwen 2.5's; Qwen 3's for reasoning), so function calls go through llama.cpp's chat
layer. Where a test needs a call or reasoning the model's answer is scripted (``script``): the tiny model's
own is random."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

UNIT = {"type": "function", "name": "get_unit", "description": "Pick a unit",
        "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["unit"]}}


CALL = '<tool_call>\n{"name": "get_unit", "arguments": {"unit": "c"}}\n</tool_call>'


@pytest.fixture(scope="module")
def agent(start_server, tools_path, thinking_path):
    return start_server([{"model": str(tools_path), "model_alias": "tools", "n_parallel": 2, "n_ctx": 1024},
                         {"model": str(thinking_path), "model_alias": "think", "n_parallel": 1, "n_ctx": 1024}],
                        max_tokens_limit=300)


def test_plain_response(agent):
    client = agent.client()
    r = client.responses.create(model="tools", input="Hello there", max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.store is False
    msg = [o for o in r.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].role == "assistant" and msg[0].content[0].type == "output_text"
    assert r.output_text == msg[0].content[0].text and r.output_text
    assert 0 < r.usage.output_tokens <= 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # the same greedy request through chat completions gives the same text (one generation path)
    chat = client.chat.completions.create(model="tools", messages=[{"role": "user", "content": "Hello there"}],
                                          max_tokens=6, temperature=0)
    assert chat.choices[0].message.content == r.output_text
    if r.usage.output_tokens == 6:
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_streaming_event_sequence(agent):
    client = agent.client()
    events = list(client.responses.create(model="tools", input=[{"role": "user", "content": "Hello there"}],
                                          instructions="Answer briefly.", max_output_tokens=6, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          kinds[-1]] and kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text == events[-4].text and final.usage.output_tokens > 0
    plain = client.responses.create(model="tools", input=[{"role": "user", "content": "Hello there"}],
                                    instructions="Answer briefly.", max_output_tokens=6, temperature=0)
    assert plain.output_text == text


def test_function_call_round_trip(agent, script):
    client = agent.client()
    ask = [{"role": "user", "content": "Which unit?"}]
    script(agent, "tools", CALL)
    r = client.responses.create(model="tools", input=ask, tools=[UNIT], tool_choice="required", temperature=0,
                                max_output_tokens=200)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_unit" and json.loads(call.arguments) == {"unit": "c"} and call.call_id
    # the client runs the tool and sends the call with its output
    follow = ask + [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                     "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": "celsius"}]
    script(agent, "tools", "It is Celsius.")
    r2 = client.responses.create(model="tools", input=follow, tools=[UNIT], max_output_tokens=50)
    assert r2.status == "completed" and r2.output_text == "It is Celsius."
    # the call and its output reached the prompt through the template
    count = client.chat.completions.create(model="tools", max_tokens=1, messages=[
        {"role": "user", "content": "Which unit?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "get_unit", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "celsius"}], tools=[
        {"type": "function", "function": {k: v for k, v in UNIT.items() if k != "type"}}])
    assert r2.usage.input_tokens == count.usage.prompt_tokens > r.usage.input_tokens


def test_streamed_function_call(agent, script):
    client = agent.client()
    script(agent, "tools", CALL)
    events = list(client.responses.create(model="tools", input="Which unit?", tools=[UNIT],
                                          tool_choice={"type": "function", "name": "get_unit"}, temperature=0,
                                          max_output_tokens=200, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2].item
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert added.type == "function_call" and added.name == "get_unit" and json.loads(deltas) == {"unit": "c"}
    assert events[-3].arguments == deltas
    call = events[-1].response.output[0]
    assert call.arguments == deltas and call.call_id == added.call_id and call.status == "completed"


def test_reasoning_items(agent, script):
    client = agent.client()
    answer = "<think>\nThe user wants a unit.\n</think>\n\n" + CALL
    script(agent, "think", answer)
    r = client.responses.create(model="think", input="Which unit?", tools=[UNIT], max_output_tokens=200,
                                reasoning={"effort": "low"})
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text.strip() == "The user wants a unit."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    script(agent, "think", answer)
    events = list(client.responses.create(model="think", input="Which unit?", tools=[UNIT], max_output_tokens=200,
                                          stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and kinds.index("response.reasoning_text.done") < kinds.index(
        "response.function_call_arguments.done")
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        final.output[0].content[0].text


def test_text_format_json_schema(agent):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = agent.client().responses.create(model="tools", input="A number", temperature=0, max_output_tokens=40,
                                        text={"format": {"type": "json_schema", "name": "num", "schema": schema}})
    assert r.status == "completed"
    assert isinstance(json.loads(r.output_text)["n"], int)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "function_call_output", "call_id": "missing", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "computer_call"}]}, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
])
def test_bad_input_is_an_openai_error(agent, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        agent.client().responses.create(model="tools", **body)
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"]


def test_malformed_body_is_an_openai_error(agent):
    r = httpx.post(agent.url + "/v1/responses", json={"model": "tools"})  # no input
    assert r.status_code == 422 and r.json()["error"]["param"] == "input"
