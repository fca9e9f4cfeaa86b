"""Python bindings for llama.cpp.

Importing the package loads nothing native: the libraries are loaded on first use, so
``import llama_cpp`` is fast and prints nothing. Logs go through :mod:`logging`.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ._errors import (
    BackendUnavailableError,
    ClosedError,
    ContextError,
    ContextOverflowError,
    DecodeError,
    LibraryLoadError,
    LibraryNotFoundError,
    LlamaError,
    ModelLoadError,
    MultimodalError,
    OptionalSymbolMissing,
    SpeculativeError,
    TemplateError,
    TokenizationError,
)
from ._version import __version__

# A library leaves output to the application: without this, Python's last-resort handler would
# print llama.cpp's warnings to stderr. Configure logging (or use the CLI) to see them.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Public names resolved lazily: name -> module that defines it.
_LAZY = {
    "backends": "._loader",
    "system_info": "._loader",
    "lib_dir": "._loader",
    "Llama": ".llama",
    "LlamaEmbedding": ".llama_embedding",
    "LlamaBatch": ".llama_batch",
    "LlamaBatchExt": ".llama_batch",
    "SpecConfig": ".speculative",
    "SpeculativeType": ".speculative",
    "SpeculativeStats": ".speculative",
    "MTPDecoder": ".speculative",
    "MTMDEmbeddingHandler": ".mtmd",
    "MTMDChatHandler": ".mtmd_chat",
    "MultimodalChat": ".mtmd_chat",
}

__all__ = [
    "__version__",
    "BackendUnavailableError",
    "ClosedError",
    "ContextError",
    "ContextOverflowError",
    "DecodeError",
    "LibraryLoadError",
    "LibraryNotFoundError",
    "LlamaError",
    "ModelLoadError",
    "MultimodalError",
    "OptionalSymbolMissing",
    "SpeculativeError",
    "TemplateError",
    "TokenizationError",
    "backends",
    "system_info",
    "lib_dir",
    "Llama",
    "LlamaEmbedding",
    "LlamaBatch",
    "LlamaBatchExt",
    "SpecConfig",
    "SpeculativeType",
    "SpeculativeStats",
    "MTPDecoder",
    "MTMDEmbeddingHandler",
    "MTMDChatHandler",
    "MultimodalChat",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
