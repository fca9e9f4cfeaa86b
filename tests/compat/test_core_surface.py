"""llama-cpp-python 0.3.36's top-level names resolve from ``llama_cpp``, lazily."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import llama_cpp
from tests.conftest import REPO

# what upstream's `from .llama_cpp import *; from .llama import *` puts at the top level (a sample of
# each kind) and the names of its llama_types module
TOP_LEVEL = [
    "Llama", "LlamaGrammar", "LlamaState", "LlamaRAMCache", "LlamaDiskCache", "LlamaCache", "BaseLlamaCache",
    "LogitsProcessorList", "StoppingCriteriaList", "LogitsProcessor", "StoppingCriteria",
    "MinTokensLogitsProcessor", "LlamaTokenizer", "BaseLlamaTokenizer", "LlamaDraftModel",
    "ChatCompletionRequestUserMessage", "ChatCompletionRequestSystemMessage", "CreateCompletionResponse",
    "GGML_TYPE_Q8_0", "GGML_TYPE_F16", "LLAMA_DEFAULT_SEED", "LLAMA_POOLING_TYPE_MEAN", "LLAMA_LOAD_MODE_MMAP",
    "llama_backend_init", "llama_model_default_params", "llama_context_default_params", "llama_supports_mmap",
    "llama_token_data", "llama_batch", "GGML_NUMA_STRATEGY_DISABLED",
]
UPSTREAM_TYPES = """
JsonType EmbeddingUsage Embedding CreateEmbeddingResponse CompletionLogprobs CompletionChoice CompletionUsage
CreateCompletionResponse ChatCompletionResponseFunctionCall ChatCompletionResponseMessage ChatCompletionFunction
ChatCompletionTopLogprobToken ChatCompletionLogprobToken ChatCompletionLogprobs ChatCompletionResponseChoice
CreateChatCompletionResponse ChatCompletionMessageToolCallChunkFunction ChatCompletionMessageToolCallChunk
ChatCompletionStreamResponseDeltaEmpty ChatCompletionStreamResponseDeltaFunctionCall
ChatCompletionStreamResponseDelta ChatCompletionStreamResponseChoice CreateChatCompletionStreamResponse
ChatCompletionFunctions ChatCompletionFunctionCallOption ChatCompletionRequestResponseFormat
ChatCompletionRequestMessageContentPartText ChatCompletionRequestMessageContentPartImageImageUrl
ChatCompletionRequestMessageContentPartImage ChatCompletionRequestMessageContentPart
ChatCompletionRequestSystemMessage ChatCompletionRequestUserMessage ChatCompletionMessageToolCallFunction
ChatCompletionMessageToolCall ChatCompletionMessageToolCalls ChatCompletionRequestAssistantMessageFunctionCall
ChatCompletionRequestAssistantMessage ChatCompletionRequestToolMessage ChatCompletionRequestFunctionMessage
ChatCompletionRequestMessage ChatCompletionRequestFunctionCallOption ChatCompletionRequestFunctionCall
ChatCompletionFunctionParameters ChatCompletionToolFunction ChatCompletionTool ChatCompletionNamedToolChoiceFunction
ChatCompletionNamedToolChoice ChatCompletionToolChoiceOption EmbeddingData CompletionChunk Completion
CreateCompletionStreamResponse ChatCompletionMessage ChatCompletionChoice ChatCompletion
ChatCompletionChunkDeltaEmpty ChatCompletionChunkChoice ChatCompletionChunkDelta ChatCompletionChunk
ChatCompletionStreamResponse ChatCompletionResponseFunction ChatCompletionFunctionCall
""".split()


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name(name):
    assert getattr(llama_cpp, name) is not None
    assert name in dir(llama_cpp)


@pytest.mark.parametrize("name", UPSTREAM_TYPES)
def test_llama_types_names(name):
    from llama_cpp import llama, llama_types

    assert getattr(llama_types, name) is getattr(llama_cpp, name) is getattr(llama, name)


def test_submodules_and_their_names():
    from llama_cpp.llama import LlamaState, LogitsProcessorList, StoppingCriteriaList  # upstream's import paths
    from llama_cpp.llama_cache import LlamaCache, LlamaDiskCache, LlamaRAMCache
    from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
    from llama_cpp.llama_tokenizer import LlamaHFTokenizer, LlamaTokenizer

    assert LlamaCache is LlamaRAMCache and issubclass(LlamaDiskCache, llama_cpp.BaseLlamaCache)
    assert issubclass(LlamaPromptLookupDecoding, LlamaDraftModel)
    assert llama_cpp.LlamaState is LlamaState and llama_cpp.LlamaTokenizer is LlamaTokenizer
    assert isinstance(LogitsProcessorList(), list) and isinstance(StoppingCriteriaList(), list)
    assert LlamaHFTokenizer.__name__ == "LlamaHFTokenizer"
    assert llama_cpp.llama_cache.LlamaRAMCache is LlamaRAMCache


def test_unknown_name_is_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope_not_here'"):
        llama_cpp.nope_not_here  # noqa: B018
    with pytest.raises(AttributeError):
        llama_cpp.ctypes  # noqa: B018 (a module the bindings import is not a package name)


def test_import_star_and_names_load_no_library():
    """The whole namespace resolves (``import *``, low-level names) without loading a native library."""
    code = textwrap.dedent("""
        import sys, time
        t = time.perf_counter()
        import llama_cpp
        dt = time.perf_counter() - t
        ns = {}
        exec("from llama_cpp import *", ns)
        assert "Llama" in ns and "GGML_TYPE_Q8_0" in ns and "llama_backend_init" in ns, sorted(ns)[:20]
        assert "LlamaRAMCache" in ns and "ChatCompletionRequestUserMessage" in ns
        llama_cpp.GGML_TYPE_Q8_0, llama_cpp.llama_model_default_params, llama_cpp.LogitsProcessorList
        maps = open("/proc/self/maps").read()
        assert "libllama" not in maps and "libggml" not in maps, "a native library was loaded"
        print(dt)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_errors_are_catchable_the_old_way():
    from llama_cpp._errors import CacheError, CallbackError, ContextError, ModelLoadError, TokenizationError

    assert issubclass(CallbackError, RuntimeError) and issubclass(CallbackError, llama_cpp.LlamaError)
    assert issubclass(CacheError, OSError)
    assert issubclass(ModelLoadError, ValueError)  # upstream: ValueError for a missing/bad model path
    assert issubclass(ContextError, RuntimeError)  # upstream: RuntimeError when llama.cpp fails
    assert issubclass(TokenizationError, ValueError)
    assert llama_cpp.CallbackError is CallbackError and llama_cpp.CacheError is CacheError


def test_missing_model_path_is_value_error(tmp_path):
    with pytest.raises(ValueError):
        llama_cpp.Llama(str(tmp_path / "absent.gguf"), verbose=False)
