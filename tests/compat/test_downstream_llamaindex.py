"""LlamaIndex's ``LlamaCPP`` LLM (llama-index-llms-llama-cpp) running on this package.

It calls ``Llama(model_path=..., n_ctx=..., verbose=...)``, reads ``n_ctx()`` and
``context_params.n_ctx``, and completes through ``Llama.__call__`` with ``generate_kwargs``; chat
renders the messages to one prompt first. Results are compared with direct calls on a separate
``Llama`` with the same parameters.
"""

from __future__ import annotations

from typing import Any

import pytest

from .downstream_support import MAX_TOKENS, N_CTX, PROMPT, completion_text, first_word_after, reference_llama

li_llm = pytest.importorskip("llama_index.llms.llama_cpp")
li_utils = pytest.importorskip("llama_index.llms.llama_cpp.llama_utils")
li_core = pytest.importorskip("llama_index.core.llms")

# the keywords LlamaCPP adds to every completion call
GENERATE = {"temperature": 0.0, "max_tokens": MAX_TOKENS}


def _llm(path: Any, **kwargs: Any) -> Any:
    kwargs = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "context_window": N_CTX, "verbose": False,
              **kwargs}
    return li_llm.LlamaCPP(model_path=str(path), **kwargs)


@pytest.fixture(scope="module")
def llm(spm_model) -> Any:
    return _llm(spm_model)


@pytest.fixture(scope="module")
def reference(spm_model) -> Any:
    return reference_llama(spm_model, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def expected(reference) -> str:
    text = completion_text(reference, PROMPT, **GENERATE)
    assert text.strip(), "the fixture generated nothing: the comparisons below would be vacuous"
    return text


def _messages() -> list[Any]:
    ChatMessage = li_core.ChatMessage
    return [ChatMessage(role="system", content="You answer briefly."), ChatMessage(role="user", content="Hello")]


def test_metadata_reads_the_context_window(llm) -> None:
    from llama_cpp import Llama

    assert isinstance(llm._model, Llama)
    meta = llm.metadata
    assert meta.context_window == N_CTX == llm._model.n_ctx() == llm._model.context_params.n_ctx
    assert meta.num_output == MAX_TOKENS


def test_complete_equals_create_completion(llm, expected) -> None:
    response = llm.complete(PROMPT)
    assert response.text == expected
    assert response.raw["choices"][0]["text"] == expected


def test_stream_complete_deltas_join_to_the_completion(llm, expected) -> None:
    responses = list(llm.stream_complete(PROMPT))
    assert len(responses) > 1
    assert "".join(r.delta for r in responses) == expected
    assert responses[-1].text == expected


def test_generate_kwargs_reach_the_call(spm_model, reference) -> None:
    stop_source = completion_text(reference, PROMPT, **GENERATE)
    stop = first_word_after(stop_source)
    with_stop = _llm(spm_model, generate_kwargs={"stop": [stop], "repeat_penalty": 1.3})
    want = completion_text(reference, PROMPT, stop=[stop], repeat_penalty=1.3, **GENERATE)
    assert with_stop.complete(PROMPT).text == want
    assert stop not in want


def test_chat_renders_then_completes(llm, reference) -> None:
    messages = _messages()
    prompt = llm.messages_to_prompt(messages)
    assert "Hello" in prompt
    want = completion_text(reference, prompt, **GENERATE)
    reply = llm.chat(messages)
    assert reply.message.content == want
    assert reply.message.role == "assistant"


def test_stream_chat_deltas_join_to_the_reply(llm, reference) -> None:
    messages = _messages()
    want = completion_text(reference, llm.messages_to_prompt(messages), **GENERATE)
    responses = list(llm.stream_chat(messages))
    assert len(responses) > 1
    assert "".join(r.delta or "" for r in responses) == want
    assert responses[-1].message.content == want


def test_llama2_prompt_helpers(spm_model, reference) -> None:
    """The package's own Llama-2 prompt formatters, as its documentation configures them."""
    llm = _llm(spm_model, messages_to_prompt=li_utils.messages_to_prompt,
               completion_to_prompt=li_utils.completion_to_prompt)
    want = completion_text(reference, li_utils.completion_to_prompt(PROMPT), **GENERATE)
    assert llm.complete(PROMPT).text == want
    chat_prompt = li_utils.messages_to_prompt(_messages())
    assert llm.chat(_messages()).message.content == completion_text(reference, chat_prompt, **GENERATE)


def test_predict_formats_the_template_then_completes(llm, reference) -> None:
    from llama_index.core.prompts import PromptTemplate

    template = PromptTemplate("Question: {q}\nAnswer:")
    want = completion_text(reference, "Question: Why?\nAnswer:", **GENERATE)
    assert llm.predict(template, q="Why?") == want
    assert "".join(llm.stream(template, q="Why?")) == want


def test_model_kwargs_reach_llama(spm_model) -> None:
    llm = _llm(spm_model, model_kwargs={"n_batch": 32, "seed": 7})
    assert llm._model.n_batch == 32
    assert llm._model.context_params.n_batch == 32


def test_a_non_gguf_file_gets_our_error_through_llamaindex(tmp_path) -> None:
    from llama_cpp._errors import ModelLoadError

    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"not a model, just some text" * 4)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        _llm(bad)
