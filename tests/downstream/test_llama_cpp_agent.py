"""llama-cpp-agent (``LlamaCppPythonProvider``): chat, streaming, structured output and function calling.

Every call passes llama-cpp-agent's defaults, ``seed=-1`` (upstream's "random") and
``repeat_penalty=1.1``, so these run upstream's seed and penalty semantics.
(No ``from __future__ import annotations`` here: llama-cpp-agent reads the pydantic models' and
functions' annotations as classes, as in its examples.)
"""

import pytest

pytest.importorskip("llama_cpp_agent")

from llama_cpp_agent import LlamaCppAgent, MessagesFormatterType  # noqa: E402
from llama_cpp_agent.llm_output_settings import LlmStructuredOutputSettings, LlmStructuredOutputType  # noqa: E402
from llama_cpp_agent.providers import LlamaCppPythonProvider  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from llama_cpp import Llama  # noqa: E402


def _agent(path: str, fmt: MessagesFormatterType, n_ctx: int = 512):
    llm = Llama(model_path=path, n_ctx=n_ctx, verbose=False)
    provider = LlamaCppPythonProvider(llm)
    agent = LlamaCppAgent(provider, system_prompt="You are helpful.", predefined_messages_formatter_type=fmt)
    settings = provider.get_provider_default_settings()
    settings.max_tokens, settings.temperature = 12, 0.0
    return llm, agent, settings


@pytest.fixture
def tiny(spm_path):
    llm, agent, settings = _agent(spm_path, MessagesFormatterType.CHATML)
    yield agent, settings
    llm.close()


def test_the_defaults_are_upstreams_random_seed_and_penalty(tiny):
    _, settings = tiny
    assert settings.seed == -1 and settings.repeat_penalty == 1.1


def test_chat(tiny, record):
    agent, settings = tiny
    out = record("text", agent.get_chat_response("Hello", llm_sampling_settings=settings))
    assert isinstance(out, str) and out


def test_streaming(tiny, record):
    agent, settings = tiny
    settings.stream = True
    chunks = list(agent.get_chat_response("Hello", llm_sampling_settings=settings, returns_streaming_generator=True))
    record("chunks", [c if isinstance(c, str) else str(c) for c in chunks])
    assert chunks


def test_text_completion_sampled(tiny, record):
    agent, settings = tiny
    settings.temperature = 0.8  # seed=-1: a fresh random seed per call, as upstream
    assert isinstance(agent.get_text_response("Once upon a time", llm_sampling_settings=settings), str)


class Book(BaseModel):
    """A book."""

    title: str = Field(..., description="Title")
    pages: int = Field(..., description="Pages")


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@pytest.fixture(scope="module")
def gemma(gemma_path):
    llm, agent, settings = _agent(gemma_path, MessagesFormatterType.GEMMA_2, n_ctx=2048)
    settings.max_tokens = 150
    yield agent, settings
    llm.close()


def test_structured_output(gemma, record):
    agent, settings = gemma
    so = LlmStructuredOutputSettings.from_pydantic_models([Book], output_type=LlmStructuredOutputType.object_instance)
    book = agent.get_chat_response("Make a book about cats", structured_output_settings=so,
                                   llm_sampling_settings=settings)
    assert isinstance(book, Book)
    record("book", book.model_dump())


def test_function_calling(gemma, record):
    agent, settings = gemma
    fo = LlmStructuredOutputSettings.from_functions([add], allow_parallel_function_calling=False)
    calls = record("calls", agent.get_chat_response("Add 2 and 3", structured_output_settings=fo,
                                                    llm_sampling_settings=settings))
    assert calls[0]["function"] == "add" and calls[0]["return_value"] == add(**calls[0]["arguments"])
