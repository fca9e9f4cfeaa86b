"""Python bindings for llama.cpp.

Importing the package loads nothing native: the libraries are loaded on first use, so
``import llama_cpp`` is fast and prints nothing. Logs go through :mod:`logging`.

The namespace is llama-cpp-python's: ``Llama`` and its helpers (``LlamaGrammar``, ``LlamaState``,
the caches, ``LogitsProcessorList``, ...), the ``llama_types`` names and every low-level
``llama_*``/``LLAMA_*``/``ggml_*``/``GGML_*`` name of :mod:`llama_cpp.llama_cpp` and
:mod:`llama_cpp.ggml_cpp`, each resolved (and its module imported) on first access.
"""

# ruff: noqa: F401 (the imports are re-exports; __all__ is computed on first use, in __getattr__)
from __future__ import annotations

import importlib
import logging
import types
from typing import TYPE_CHECKING, Any

from ._errors import (
    BackendUnavailableError,
    CacheError,
    CallbackError,
    ClosedError,
    ContextError,
    ContextOverflowError,
    DecodeError,
    LibraryLoadError,
    LibraryNotFoundError,
    LlamaError,
    ModelLoadError,
    ModelNotFoundError,
    MultimodalError,
    NotInProcessError,
    OptionalSymbolMissing,
    SpeculativeError,
    TemplateError,
    TokenizationError,
    WorkerLostError,
)
from ._native import ctypes_util as _ctypes_util
from ._version import __version__

if TYPE_CHECKING:
    import ctypes
    from pathlib import Path

# A library leaves output to the application: without this, Python's last-resort handler would
# print llama.cpp's warnings to stderr. Configure logging (or use the CLI) to see them.
logging.getLogger(__name__).addHandler(logging.NullHandler())


def _library_handle(name: str) -> ctypes.CDLL:
    from ._native.loader import library_handle

    return library_handle(name)


def _library_path(name: str) -> Path | None:
    from ._native.loader import library_path

    return library_path(name)


# The bindings find their libraries through the loader, which is imported on the first call.
_ctypes_util.set_library_source(_library_handle, _library_path)

# Public names resolved lazily: name -> module that defines it.
_LAZY = {
    "backends": "._native.loader",
    "ensure_backends": "._native.loader",
    "system_info": "._native.loader",
    "lib_dir": "._native.loader",
    "fit_params": "._placement.fit",
    "FitResult": "._placement.fit",
    "Llama": ".llama",
    "LlamaEmbedding": ".llama_embedding",
    "LlamaEmbeddingWorker": ".llama_embedding",
    "LlamaWorker": ".llama_worker",
    "LlamaBatch": ".llama_batch",
    "LlamaBatchExt": ".llama_batch",
    "SpecConfig": ".speculative",
    "SpeculativeType": ".speculative",
    "SpeculativeStats": ".speculative",
    "MTPDecoder": ".speculative",
    "MTMDEmbeddingHandler": ".mtmd",
    "MTMDChatHandler": ".mtmd_chat",
    "MultimodalChat": ".mtmd_chat",
    # llama-cpp-python's top level (its llama module's names)
    "LlamaGrammar": ".llama_grammar",
    "LlamaState": "._compat.state",
    "BaseLlamaCache": ".llama_cache",
    "LlamaCache": ".llama_cache",
    "LlamaRAMCache": ".llama_cache",
    "LlamaDiskCache": ".llama_cache",
    "LogitsProcessor": "._compat.hooks",
    "LogitsProcessorList": "._compat.hooks",
    "StoppingCriteria": "._compat.hooks",
    "StoppingCriteriaList": "._compat.hooks",
    "MinTokensLogitsProcessor": "._compat.hooks",
    "BaseLlamaTokenizer": ".llama_tokenizer",
    "LlamaTokenizer": ".llama_tokenizer",
    "LlamaHFTokenizer": ".llama_tokenizer",
    "LlamaDraftModel": ".llama_speculative",
    "LlamaPromptLookupDecoding": ".llama_speculative",
}

# Submodules reachable as attributes before anything imported them (``llama_cpp.llama_cache``).
_SUBMODULES = frozenset({
    "llama", "llama_cpp", "ggml_cpp", "mtmd_cpp", "llama_types", "llama_chat_format", "llama_grammar",
    "llama_cache", "llama_tokenizer", "llama_speculative", "llama_embedding", "llama_batch", "mtmd",
    "mtmd_chat", "speculative",
})
# Modules whose public names are the package's too, searched in this order after _LAZY.
_NAMESPACES = (".llama_types", ".llama_cpp", ".ggml_cpp")
_NOT_EXPORTED = frozenset({"annotations", "BindingSet", "TYPE_CHECKING", "Any", "Dict", "List", "Literal",
                           "Optional", "TypedDict", "Union"})

# the package's own names; __all__ adds the namespaces' (computed on first use, see __getattr__)
_OWN = [
    "__version__",
    "BackendUnavailableError",
    "CacheError",
    "CallbackError",
    "ClosedError",
    "ContextError",
    "ContextOverflowError",
    "DecodeError",
    "LibraryLoadError",
    "LibraryNotFoundError",
    "LlamaError",
    "ModelLoadError",
    "ModelNotFoundError",
    "MultimodalError",
    "NotInProcessError",
    "OptionalSymbolMissing",
    "SpeculativeError",
    "TemplateError",
    "TokenizationError",
    "WorkerLostError",
    "backends",
    "ensure_backends",
    "system_info",
    "lib_dir",
    "fit_params",
    "FitResult",
    "Llama",
    "LlamaEmbedding",
    "LlamaEmbeddingWorker",
    "LlamaWorker",
    "LlamaBatch",
    "LlamaBatchExt",
    "SpecConfig",
    "SpeculativeType",
    "SpeculativeStats",
    "MTPDecoder",
    "MTMDEmbeddingHandler",
    "MTMDChatHandler",
    "MultimodalChat",
    "LlamaGrammar",
    "LlamaState",
    "BaseLlamaCache",
    "LlamaCache",
    "LlamaRAMCache",
    "LlamaDiskCache",
    "LogitsProcessor",
    "LogitsProcessorList",
    "StoppingCriteria",
    "StoppingCriteriaList",
    "MinTokensLogitsProcessor",
    "BaseLlamaTokenizer",
    "LlamaTokenizer",
    "LlamaHFTokenizer",
    "LlamaDraftModel",
    "LlamaPromptLookupDecoding",
]


def _public(module: Any) -> list[str]:
    return [n for n, v in vars(module).items()
            if not n.startswith("_") and n not in _NOT_EXPORTED and not isinstance(v, types.ModuleType)]


def __getattr__(name: str) -> Any:
    if name == "__all__":  # ``from llama_cpp import *`` gets upstream's whole namespace
        names = list(_OWN)
        for ns in _NAMESPACES:
            names += [n for n in _public(importlib.import_module(ns, __name__)) if n not in names]
        globals()["__all__"] = names
        return names
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name.startswith("_") or name in _NOT_EXPORTED:
        raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")
    else:
        for ns in _NAMESPACES:
            mod = importlib.import_module(ns, __name__)
            value = vars(mod).get(name, _MISSING)
            if value is not _MISSING and not isinstance(value, types.ModuleType):
                break
        else:
            raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")
    globals()[name] = value
    return value


_MISSING = object()


def __dir__() -> list[str]:
    """Every public name, the low-level ones included (this imports the binding modules, which
    load no library)."""
    names = set(globals()) | set(_LAZY) | _SUBMODULES
    for ns in _NAMESPACES:
        names.update(_public(importlib.import_module(ns, __name__)))
    return sorted(names)
