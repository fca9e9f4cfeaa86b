"""Python bindings for llama.cpp.

Importing the package loads nothing native: the libraries are loaded on first use, so
``import llama_cpp`` is fast and prints nothing. Logs go through :mod:`logging`.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from . import _ctypes_util
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

if TYPE_CHECKING:
    import ctypes
    from pathlib import Path

# A library leaves output to the application: without this, Python's last-resort handler would
# print llama.cpp's warnings to stderr. Configure logging (or use the CLI) to see them.
logging.getLogger(__name__).addHandler(logging.NullHandler())


def _library_handle(name: str) -> ctypes.CDLL:
    from ._loader import library_handle

    return library_handle(name)


def _library_path(name: str) -> Path | None:
    from ._loader import library_path

    return library_path(name)


# The bindings find their libraries through the loader, which is imported on the first call.
_ctypes_util.set_library_source(_library_handle, _library_path)

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
