"""LangChain's llama-cpp-python integrations (langchain-community) running on this package.

``LlamaCpp``, ``ChatLlamaCpp`` and ``LlamaCppEmbeddings`` are used exactly as their users use them;
every result is compared with a direct call on a separate ``Llama`` with the same parameters.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from .downstream_support import (
    MAX_TOKENS,
    N_CTX,
    PROMPT,
    assert_rows_close,
    chat_text,
    completion_text,
    embedding_model,
    first_word_after,
    obsolete_keywords_allowed,
    reference_llama,
)

pytest.importorskip("langchain_community")
lc_llms = pytest.importorskip("langchain_community.llms")
lc_chat = pytest.importorskip("langchain_community.chat_models")
lc_emb = pytest.importorskip("langchain_community.embeddings")
lc_callbacks = pytest.importorskip("langchain_core.callbacks")

pytestmark = pytest.mark.filterwarnings(
    # langchain-community announces its own sunset on import
    "ignore:.*langchain-community.*:DeprecationWarning",
)

# What LangChain's LlamaCpp sends with every completion call (its field defaults) besides the
# prompt and max_tokens; the reference call uses the same values.
LLM_SAMPLING = {"temperature": 0.0, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1}
# ... and the model keywords it always passes that change what the model computes.
LLM_MODEL = {"n_ctx": N_CTX, "n_batch": 8, "rope_freq_base": 10000.0, "rope_freq_scale": 1.0,
             "last_n_tokens_size": 64}

SYSTEM = "You answer in one short line."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
QUESTION = "Say hello."


def _llm(path: Any, **kwargs: Any) -> Any:
    kwargs = {"n_ctx": N_CTX, "temperature": 0.0, "max_tokens": MAX_TOKENS, "verbose": False, **kwargs}
    with obsolete_keywords_allowed():
        return lc_llms.LlamaCpp(model_path=str(path), **kwargs)


def _chat(path: Any, **kwargs: Any) -> Any:
    kwargs = {"n_ctx": N_CTX, "temperature": 0.0, "max_tokens": MAX_TOKENS, "verbose": False, **kwargs}
    with obsolete_keywords_allowed():
        return lc_chat.ChatLlamaCpp(model_path=str(path), **kwargs)


@pytest.fixture(scope="module")
def reference(spm_model) -> Any:
    return reference_llama(spm_model, **LLM_MODEL)


@pytest.fixture(scope="module")
def expected(reference) -> str:
    text = completion_text(reference, PROMPT, max_tokens=MAX_TOKENS, stop=[], **LLM_SAMPLING)
    assert text.strip(), "the fixture generated nothing: the comparisons below would be vacuous"
    return text


@pytest.fixture(scope="module")
def llm(spm_model) -> Any:
    return _llm(spm_model, streaming=False)


# -- LlamaCpp (completion) --------------------------------------------------------------------

def test_llamacpp_builds_a_llama_from_langchains_keywords(llm) -> None:
    from llama_cpp import Llama

    assert isinstance(llm.client, Llama)
    assert llm.client.n_ctx() == N_CTX


def test_llamacpp_greedy_completion_equals_create_completion(llm, expected) -> None:
    assert llm.invoke(PROMPT) == expected


def test_llamacpp_streaming_chunks_join_to_the_completion(llm, expected) -> None:
    chunks = list(llm.stream(PROMPT))
    assert len(chunks) > 1, "expected one chunk per generated piece"
    assert all(isinstance(c, str) for c in chunks)
    assert "".join(chunks) == expected


def test_llamacpp_streaming_mode_invoke_and_token_callbacks(spm_model, expected) -> None:
    tokens: list[str] = []

    class Collect(lc_callbacks.BaseCallbackHandler):
        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            tokens.append(token)

    streaming = _llm(spm_model, streaming=True)
    assert streaming.invoke(PROMPT, config={"callbacks": [Collect()]}) == expected
    assert len(tokens) > 1
    assert "".join(tokens) == expected


def test_llamacpp_stop_sequence_cuts_the_completion(llm, expected) -> None:
    stop = first_word_after(expected)
    out = llm.invoke(PROMPT, stop=[stop])
    assert out == expected[: expected.index(stop)]
    assert stop not in out


def test_llamacpp_generate_reports_each_prompt(llm, reference, expected) -> None:
    other = "Once upon a time"
    result = llm.generate([PROMPT, other])
    texts = [g[0].text for g in result.generations]
    assert texts == [expected,
                     completion_text(reference, other, max_tokens=MAX_TOKENS, stop=[], **LLM_SAMPLING)]


def test_llamacpp_in_a_prompt_template_chain(llm, reference) -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate

    chain = PromptTemplate.from_template("Question: {q}\nAnswer:") | llm | StrOutputParser()
    want = completion_text(reference, "Question: Why?\nAnswer:", max_tokens=MAX_TOKENS, stop=[], **LLM_SAMPLING)
    assert chain.invoke({"q": "Why?"}) == want
    assert chain.batch([{"q": "Why?"}, {"q": "Why?"}]) == [want, want]


def test_llamacpp_get_num_tokens_is_our_tokenizer(llm, reference) -> None:
    text = "Hello world, the quick brown fox"
    assert llm.get_num_tokens(text) == len(reference.tokenize(text.encode("utf-8")))


def test_llamacpp_grammar_string_constrains_the_output(spm_model) -> None:
    constrained = _llm(spm_model, streaming=False, grammar='root ::= "yes" | "no"')
    from llama_cpp import LlamaGrammar

    assert isinstance(constrained.grammar, LlamaGrammar)
    assert constrained.invoke("Is it raining?") in {"yes", "no"}


def test_llamacpp_grammar_path_constrains_the_output(spm_model, tmp_path) -> None:
    path = tmp_path / "digits.gbnf"
    path.write_text('root ::= [0-9] [0-9] [0-9]\n', encoding="utf-8")
    constrained = _llm(spm_model, streaming=False, grammar_path=str(path))
    out = constrained.invoke("A number:")
    assert len(out) == 3 and out.isdigit()


def test_llamacpp_sampled_output_follows_the_seed(spm_model, expected) -> None:
    sampled = {"temperature": 0.9, "top_p": 1.0, "top_k": 0}
    first = [_llm(spm_model, streaming=False, seed=1234, **sampled).invoke(PROMPT) for _ in range(2)]
    other = _llm(spm_model, streaming=False, seed=99, **sampled).invoke(PROMPT)
    assert first[0] == first[1], "the same seed must give the same sample"
    assert first[0] != expected, "temperature 0.9 sampled the greedy text: the seed check is vacuous"
    assert other != first[0]


def test_llamacpp_reports_a_missing_model_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="Could not load Llama model"):
        _llm(tmp_path / "missing.gguf")


# -- ChatLlamaCpp -----------------------------------------------------------------------------

CHAT_SAMPLING = {"temperature": 0.0, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1}


@pytest.fixture(scope="module")
def chat(spm_model) -> Any:
    """Non-streaming: one create_chat_completion call per invoke (the default streams)."""
    return _chat(spm_model, streaming=False)


@pytest.fixture(scope="module")
def streaming_chat(spm_model) -> Any:
    chat = _chat(spm_model)
    assert chat.streaming, "ChatLlamaCpp streams by default"
    return chat


@pytest.fixture(scope="module")
def expected_chat(reference) -> tuple[str, dict[str, Any]]:
    out = reference.create_chat_completion(
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=MAX_TOKENS, stop=[], **CHAT_SAMPLING)
    content = out["choices"][0]["message"]["content"]
    assert content.strip()
    return content, out


def test_chatllamacpp_invoke_equals_create_chat_completion(chat, streaming_chat, expected_chat) -> None:
    content, raw = expected_chat
    for model in (chat, streaming_chat):
        msg = model.invoke([("system", SYSTEM), ("human", QUESTION)])
        assert msg.content == content
        assert msg.response_metadata["finish_reason"] == raw["choices"][0]["finish_reason"]


def test_chatllamacpp_reports_token_usage(chat, expected_chat) -> None:
    _, raw = expected_chat
    msg = chat.invoke([("system", SYSTEM), ("human", QUESTION)])
    assert msg.response_metadata["token_usage"] == raw["usage"]
    assert raw["usage"]["completion_tokens"] > 0


def test_chatllamacpp_stream_joins_to_the_reply(streaming_chat, expected_chat) -> None:
    content, raw = expected_chat
    chunks = list(streaming_chat.stream([("system", SYSTEM), ("human", QUESTION)]))
    assert len(chunks) > 1
    assert "".join(c.content for c in chunks) == content
    finals = [c.response_metadata.get("finish_reason") for c in chunks if c.response_metadata.get("finish_reason")]
    assert finals == [raw["choices"][0]["finish_reason"]]


def test_chatllamacpp_multi_turn_history(chat, reference) -> None:
    m = lc_chat_messages()
    history = [m.SystemMessage(SYSTEM), m.HumanMessage(QUESTION), m.AIMessage("Hello there."),
               m.HumanMessage("Again, please.")]
    want = chat_text(reference, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
                                 {"role": "assistant", "content": "Hello there."},
                                 {"role": "user", "content": "Again, please."}],
                     max_tokens=MAX_TOKENS, stop=[], **CHAT_SAMPLING)
    assert chat.invoke(history).content == want


def test_chatllamacpp_stop_sequence(chat, expected_chat) -> None:
    content, _ = expected_chat
    stop = first_word_after(content)
    out = chat.invoke([("system", SYSTEM), ("human", QUESTION)], stop=[stop])
    assert out.content == content[: content.index(stop)]


def test_chatllamacpp_forced_tool_call_parses(spm_model) -> None:
    """``bind_tools(tool_choice=...)`` through a function-calling chat handler: the arguments the
    grammar forces are valid JSON for the tool's schema, and LangChain parses them into a tool call."""
    from llama_cpp.llama_chat_format import get_chat_completion_handler

    # room for the whole JSON object: a cut-off one is (rightly) an invalid tool call
    tool_chat = _chat(spm_model, max_tokens=128, model_kwargs={
        "chat_handler": get_chat_completion_handler("chatml-function-calling")})
    bound = tool_chat.bind_tools([WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = bound.invoke([("human", "What is the weather in Paris?")])
    assert msg.tool_calls, f"no tool call parsed from {msg!r}"
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather"
    assert set(call["args"]) == {"city"} and isinstance(call["args"]["city"], str)
    raw = msg.additional_kwargs["tool_calls"][0]["function"]["arguments"]
    assert json.loads(raw) == call["args"]


def test_chatllamacpp_forced_tool_call_with_the_models_template(spm_model) -> None:
    """Without a function-calling handler, a named ``tool_choice`` goes through the model's own chat
    template with a grammar built from the tool's parameters (llama-cpp-python's Jinja path)."""
    tool_chat = _chat(spm_model, max_tokens=128)
    # tool_choice=True: LangChain sends the one tool's full definition as the choice
    msg = tool_chat.bind_tools([WEATHER], tool_choice=True).invoke("What is the weather in Paris?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg
    assert set(msg.tool_calls[0]["args"]) == {"city"}
    assert len(msg.tool_calls[0]["args"]["city"]) <= 12


def test_chatllamacpp_tool_choice_by_name(spm_model) -> None:
    msg = _chat(spm_model, max_tokens=128).bind_tools([WEATHER], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]


def test_chatllamacpp_with_structured_output_validates(spm_model) -> None:
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person."""

        name: str = Field(max_length=10)
        age: int = Field(ge=0, le=120)

    person = _chat(spm_model, max_tokens=128).with_structured_output(Person).invoke("Describe someone.")
    assert isinstance(person, Person)
    assert 0 <= person.age <= 120 and len(person.name) <= 10


def test_chatllamacpp_upstream_chat_format_keyword(spm_model, reference) -> None:
    """``model_kwargs={"chat_format": ...}`` reaches ``Llama(chat_format=...)``."""
    chatml = _chat(spm_model, streaming=False, model_kwargs={"chat_format": "chatml"})
    want = reference_llama(spm_model, chat_format="chatml", **LLM_MODEL).create_chat_completion(
        messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, stop=[], **CHAT_SAMPLING)
    assert chatml.invoke([("human", QUESTION)]).content == want["choices"][0]["message"]["content"]


def test_chatllamacpp_function_calling_chat_format(spm_model) -> None:
    """``model_kwargs={"chat_format": "chatml-function-calling"}`` (a handler-only name) gives the
    same forced tool call as passing that handler explicitly."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    question = [("human", "What is the weather in Paris?")]
    by_format = _chat(spm_model, max_tokens=128, model_kwargs={"chat_format": "chatml-function-calling"})
    from llama_cpp.llama_chat_format import get_chat_completion_handler

    by_handler = _chat(spm_model, max_tokens=128, model_kwargs={
        "chat_handler": get_chat_completion_handler("chatml-function-calling")})
    got = by_format.bind_tools([WEATHER], tool_choice=choice).invoke(question)
    want = by_handler.bind_tools([WEATHER], tool_choice=choice).invoke(question)
    assert got.tool_calls and [c["name"] for c in got.tool_calls] == ["get_weather"]
    assert [c["args"] for c in got.tool_calls] == [c["args"] for c in want.tool_calls]


def test_llamacpp_async_invoke(llm, expected) -> None:
    import asyncio

    async def both() -> list[str]:
        return [await llm.ainvoke(PROMPT), "".join([c async for c in llm.astream(PROMPT)])]

    assert asyncio.run(both()) == [expected, expected]


def lc_chat_messages() -> Any:
    import langchain_core.messages as m

    return m


# -- LlamaCppEmbeddings -----------------------------------------------------------------------

TEXTS = ["hello world", "the quick brown fox", "a"]


@pytest.fixture(scope="module")
def embeddings() -> Any:
    with obsolete_keywords_allowed():
        return lc_emb.LlamaCppEmbeddings(model_path=str(embedding_model()), n_ctx=128, verbose=False)


@pytest.fixture(scope="module")
def reference_embedder() -> Any:
    return reference_llama(embedding_model(), embedding=True, n_ctx=128)


def test_embed_documents_equals_llama_embed(embeddings, reference_embedder) -> None:
    got = embeddings.embed_documents(TEXTS)
    assert len(got) == len(TEXTS)
    assert_rows_close(got, reference_embedder.embed(TEXTS))
    assert len({tuple(np.round(r, 5)) for r in got}) == len(TEXTS), "different texts gave equal embeddings"


def test_embed_query_equals_a_document_row(embeddings, reference_embedder) -> None:
    q = embeddings.embed_query(TEXTS[1])
    assert_rows_close([q], [reference_embedder.embed(TEXTS[1])])
    assert_rows_close([q], [embeddings.embed_documents([TEXTS[1]])[0]])


def test_embeddings_equal_llama_embedding_unnormalised(embeddings) -> None:
    from llama_cpp.llama_embedding import LlamaEmbedding

    emb = LlamaEmbedding(str(embedding_model()), n_ctx=128)
    try:
        raw = emb.embed(TEXTS, normalize=-1)
        l2 = emb.embed(TEXTS)
    finally:
        emb.close()
    got = np.asarray(embeddings.embed_documents(TEXTS))
    assert_rows_close(got.tolist(), raw)
    assert_rows_close((got / np.linalg.norm(got, axis=1, keepdims=True)).tolist(), l2)


def test_embeddings_per_token_rows_without_pooling(reference_embedder) -> None:
    """With pooling NONE llama-cpp-python returns one row per token; LangChain flattens them."""
    path = embedding_model(pooling="none")
    with obsolete_keywords_allowed():
        per_token = lc_emb.LlamaCppEmbeddings(model_path=str(path), n_ctx=128, verbose=False)
    ref = reference_llama(path, embedding=True, n_ctx=128)
    rows = per_token.embed_documents([TEXTS[1]])
    want = ref.embed(TEXTS[1])
    assert len(rows) == len(ref.tokenize(TEXTS[1].encode())) == len(want)
    assert_rows_close(rows, want)
