"""Ownership wrappers over llama.cpp's native objects: model, context, sampler chain, batch, LoRA adapter.

llama-cpp-python's module of that name, kept as the facade of :mod:`llama_cpp._core`, where the
code lives: ``ownership`` (the native-reference counting every wrapper builds on), ``model``
(with LoRA adapters), ``context`` (with the batches it decodes) and ``sampler``. The classes keep
this module as their ``__module__`` (reprs and pickles name it, as before the split).
"""

from __future__ import annotations

from ._core.context import CONTEXT_PARAM_NAMES, CpuThreadpool, LlamaBatch, LlamaBatchExtNative, LlamaContext
from ._core.gguf import check_gguf_file
from ._core.model import (
    LlamaLoraAdapter,
    LlamaModel,
    amx_kernels_unsafe,
    flash_attn_type,
    load_mode_from_flags,
)
from ._core.ownership import CallableDict, CallableInt, NativePointer, float_view, unwrap
from ._core.sampler import LlamaSampler, LlamaTokenDataArray, TokenCandidates, normalize_embedding
from .llama_cpp import LLAMA_CONTEXT_TYPE_MTP

__all__ = [
    "CONTEXT_PARAM_NAMES",
    "CallableDict",
    "CallableInt",
    "CpuThreadpool",
    "LLAMA_CONTEXT_TYPE_MTP",
    "LlamaBatch",
    "LlamaBatchExtNative",
    "LlamaContext",
    "LlamaLoraAdapter",
    "LlamaModel",
    "LlamaSampler",
    "LlamaTokenDataArray",
    "NativePointer",
    "TokenCandidates",
    "amx_kernels_unsafe",
    "check_gguf_file",
    "flash_attn_type",
    "float_view",
    "load_mode_from_flags",
    "normalize_embedding",
    "unwrap",
]
