"""LangChain, LlamaIndex and Haystack's llama.cpp integrations, one documented call each, recorded for the
comparison with upstream (tests/compat/test_downstream_*.py cover LangChain and LlamaIndex in depth)."""

from __future__ import annotations

import pytest


def test_langchain_llamacpp(spm_path, record):
    llms = pytest.importorskip("langchain_community.llms")
    llm = llms.LlamaCpp(model_path=spm_path, n_ctx=256, max_tokens=10, temperature=0.0, verbose=False)
    assert isinstance(record("text", llm.invoke("Once upon a time")), str)
    # LangChain's defaults: seed=-1, repeat_penalty=1.1
    assert llm.seed == -1 and llm.repeat_penalty == 1.1


def test_langchain_chat_and_embeddings(spm_path, models, record):
    chat_models = pytest.importorskip("langchain_community.chat_models")
    embeddings = pytest.importorskip("langchain_community.embeddings")
    chat = chat_models.ChatLlamaCpp(model_path=spm_path, n_ctx=256, max_tokens=8, temperature=0.0, verbose=False)
    assert isinstance(record("chat", chat.invoke("hi").content), str)
    emb = embeddings.LlamaCppEmbeddings(model_path=str(models["embed"]), n_ctx=128, verbose=False)
    vec = emb.embed_query("hello world")
    record("embedding", [round(v, 4) for v in vec[:8]])
    assert len(vec) > 0


def test_llamaindex_llamacpp(spm_path, record):
    mod = pytest.importorskip("llama_index.llms.llama_cpp")
    llm = mod.LlamaCPP(model_path=spm_path, temperature=0.0, max_new_tokens=10, context_window=256,
                       model_kwargs={"n_ctx": 256}, verbose=False)
    assert isinstance(record("text", llm.complete("Once upon a time").text), str)
    assert isinstance(record("stream", [r.delta for r in llm.stream_complete("Hello")]), list)


def test_haystack_chat_generator(spm_path, record):
    mod = pytest.importorskip("haystack_integrations.components.generators.llama_cpp")
    dataclasses = pytest.importorskip("haystack.dataclasses")
    gen = mod.LlamaCppChatGenerator(model=spm_path, n_ctx=256, generation_kwargs={"max_tokens": 10, "temperature": 0.0})
    gen.warm_up()
    out = gen.run([dataclasses.ChatMessage.from_user("Hello")])
    assert isinstance(record("text", out["replies"][0].text), str)
