"""Stored responses (``store``, ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``) driven with
the official ``openai`` client: a continuation is the same prompt as the whole conversation sent at once,
each API key sees only its own responses, and the store stays within its bounds."""

from __future__ import annotations

import json

import openai
import pytest

from llama_cpp.server.response_store import ResponseStore, owner_of

from .test_responses import CALL, UNIT


@pytest.fixture(scope="module")
def srv(start_server, tools_path, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("sk-alice\nsk-bob\n")
    return start_server([{"model": str(tools_path), "model_alias": "tools", "n_parallel": 1, "n_ctx": 1024}],
                        api_key_file=str(keys), max_tokens_limit=300, responses_store_max=3)


def _prompt_tokens(client, messages, **kw) -> int:
    return client.chat.completions.create(model="tools", messages=messages, max_tokens=1, **kw).usage.prompt_tokens


def test_previous_response_id_continues_the_conversation(srv):
    alice = srv.client("sk-alice")
    r1 = alice.responses.create(model="tools", input="My name is Ada.", instructions="Be brief.", store=True,
                                max_output_tokens=5, temperature=0)
    assert r1.store is True and r1.previous_response_id is None
    r2 = alice.responses.create(model="tools", input="What is my name?", previous_response_id=r1.id, store=True,
                                max_output_tokens=5, temperature=0)
    assert r2.previous_response_id == r1.id and r2.store is True
    # the prompt is the stored conversation then the new input; the instructions are not carried over
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": r1.output_text},
               {"role": "user", "content": "What is my name?"}]
    assert r2.usage.input_tokens == _prompt_tokens(alice, history)
    same = alice.chat.completions.create(model="tools", messages=history, max_tokens=5, temperature=0)
    assert r2.output_text == same.choices[0].message.content
    # a chain: the third turn sees both earlier ones
    r3 = alice.responses.create(model="tools", input="Thanks.", previous_response_id=r2.id, max_output_tokens=3,
                                temperature=0, store=False)
    history += [{"role": "assistant", "content": r2.output_text}, {"role": "user", "content": "Thanks."}]
    assert r3.usage.input_tokens == _prompt_tokens(alice, history) and r3.store is False
    with pytest.raises(openai.NotFoundError):  # store false: not kept
        alice.responses.retrieve(r3.id)


def test_streamed_response_is_stored_and_continued(srv):
    alice = srv.client("sk-alice")
    events = list(alice.responses.create(model="tools", input="Hello there", store=True, max_output_tokens=5,
                                         temperature=0, stream=True))
    final = events[-1].response
    assert final.store is True
    kept = alice.responses.retrieve(final.id)
    assert kept.model_dump() == final.model_dump()
    events = list(alice.responses.create(model="tools", input="And again?", previous_response_id=final.id,
                                         max_output_tokens=5, temperature=0, stream=True))
    follow = events[-1].response
    assert follow.previous_response_id == final.id
    assert follow.usage.input_tokens == _prompt_tokens(alice, [
        {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": final.output_text},
        {"role": "user", "content": "And again?"}])


def test_function_call_output_answers_the_stored_call(srv, script):
    alice = srv.client("sk-alice")
    script(srv, "tools", CALL)
    r1 = alice.responses.create(model="tools", input="Which unit?", tools=[UNIT], tool_choice="required",
                                store=True, max_output_tokens=200)
    call = r1.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"unit": "c"}
    script(srv, "tools", "It is Celsius.")
    r2 = alice.responses.create(model="tools", previous_response_id=r1.id, tools=[UNIT], max_output_tokens=50,
                                input=[{"type": "function_call_output", "call_id": call.call_id,
                                        "output": "celsius"}])
    assert r2.output_text == "It is Celsius."
    assert r2.usage.input_tokens == _prompt_tokens(alice, [
        {"role": "user", "content": "Which unit?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "get_unit", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "celsius"}],
        tools=[{"type": "function", "function": {k: v for k, v in UNIT.items() if k != "type"}}])


def test_retrieve_and_delete(srv):
    alice = srv.client("sk-alice")
    r = alice.responses.create(model="tools", input="Hi", store=True, max_output_tokens=3, temperature=0)
    assert alice.responses.retrieve(r.id).model_dump() == r.model_dump()
    assert alice.responses.delete(r.id) is None  # the client returns nothing for OpenAI's deletion object
    for call in (alice.responses.retrieve, alice.responses.delete):
        with pytest.raises(openai.NotFoundError) as e:
            call(r.id)
        assert e.value.body["message"] == f"Response with id '{r.id}' not found."
        assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        alice.responses.create(model="tools", input="Hi", previous_response_id=r.id, max_output_tokens=3)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"
    assert r.id in e.value.body["message"]


def test_a_key_never_reads_another_keys_responses(srv):
    alice, bob = srv.client("sk-alice"), srv.client("sk-bob")
    r = alice.responses.create(model="tools", input="A secret", store=True, max_output_tokens=3, temperature=0)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        bob.responses.create(model="tools", input="Tell me", previous_response_id=r.id, max_output_tokens=3)
    assert e.value.body["code"] == "previous_response_not_found"
    assert alice.responses.retrieve(r.id).id == r.id  # bob's delete removed nothing


def test_the_store_keeps_at_most_its_limit(srv):
    alice = srv.client("sk-alice")
    ids = [alice.responses.create(model="tools", input=f"Turn {i}", store=True, max_output_tokens=2,
                                  temperature=0).id for i in range(4)]
    store = srv.app.state.responses
    assert len(store) <= 3
    with pytest.raises(openai.NotFoundError):  # the least recently used went first
        alice.responses.retrieve(ids[0])
    for rid in ids[1:]:
        assert alice.responses.retrieve(rid).id == rid


def _response(rid: str, text: str) -> dict:
    return {"id": rid, "object": "response", "output": [{"type": "message", "role": "assistant",
                                                          "content": [{"type": "output_text", "text": text}]}]}


def test_store_bounds_bytes_and_refreshes_on_use():
    one = len(json.dumps(_response("resp_a", "x" * 100))) + len(json.dumps([]))
    store = ResponseStore(max_count=10, max_bytes=2 * one + 10)
    a, b = owner_of("sk-a"), owner_of("sk-b")
    assert store.put(a, _response("resp_1", "x" * 100), []) and store.put(a, _response("resp_2", "x" * 100), [])
    assert store.get(a, "resp_1") is not None  # now the most recently used
    assert store.put(a, _response("resp_3", "x" * 100), [])
    assert store.get(a, "resp_2") is None and store.get(a, "resp_1") is not None and store.bytes <= store.max_bytes
    assert not store.put(a, _response("resp_big", "x" * 1000), [])  # over the limit alone: not kept
    assert store.get(a, "resp_big") is None and len(store) == 2 and store.evicted == 1
    assert store.get(b, "resp_1") is None and not store.delete(b, "resp_1") and store.get(a, "resp_1") is not None
    assert store.delete(a, "resp_1") and store.bytes == one
    assert not ResponseStore(0, 1 << 20).put(a, _response("resp_x", ""), [])  # storing off


def test_the_server_setting_decides_an_omitted_store(srv, monkeypatch):
    alice = srv.client("sk-alice")
    r = alice.responses.create(model="tools", input="Hi", max_output_tokens=2, temperature=0)
    assert r.store is False  # responses_store defaults to false: stateless unless asked
    monkeypatch.setattr(srv.app.state.server_settings, "responses_store", True)
    r = alice.responses.create(model="tools", input="Hi", max_output_tokens=2, temperature=0)
    assert r.store is True and alice.responses.retrieve(r.id).id == r.id


def test_input_items_list_the_conversation_a_response_answered(srv):
    alice = srv.client("sk-alice")
    r1 = alice.responses.create(model="tools", input="First question", store=True, max_output_tokens=3,
                                temperature=0)
    r2 = alice.responses.create(model="tools", input=[{"role": "user", "content": "Second question"}],
                                previous_response_id=r1.id, store=True, max_output_tokens=3, temperature=0)
    page = alice.responses.input_items.list(r2.id, order="asc")
    items = page.data
    assert [(i.type, getattr(i, "role", None)) for i in items] == [("message", "user"), ("message", "assistant"),
                                                                   ("message", "user")]
    assert items[0].content[0].text == "First question" and items[2].content[0].text == "Second question"
    assert items[1].id == r1.output[0].id and len({i.id for i in items}) == 3  # every item has its own id
    newest = alice.responses.input_items.list(r2.id, limit=2)  # desc by default, a page at a time
    assert [i.id for i in newest.data] == [items[2].id, items[1].id] and newest.has_more
    rest = alice.responses.input_items.list(r2.id, limit=2, after=newest.last_id)
    assert [i.id for i in rest.data] == [items[0].id] and not rest.has_more
    # listing the items changes nothing: the conversation continues from them as before
    r3 = alice.responses.create(model="tools", input="Third", previous_response_id=r2.id, max_output_tokens=2,
                                temperature=0)
    assert r3.usage.input_tokens == _prompt_tokens(alice, [
        {"role": "user", "content": "First question"}, {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "Second question"}, {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "Third"}])
    with pytest.raises(openai.NotFoundError):
        srv.client("sk-bob").responses.input_items.list(r2.id)
    with pytest.raises(openai.BadRequestError):
        alice.responses.input_items.list(r2.id, limit=0)
