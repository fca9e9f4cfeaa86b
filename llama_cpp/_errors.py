"""The exception hierarchy of llama_cpp. Every message names the problem and the fix."""

from __future__ import annotations


class LlamaError(Exception):
    """Base class of every error raised by llama_cpp."""


class LibraryNotFoundError(LlamaError, FileNotFoundError):
    """A native library is not where the package (or the override variable) says it is."""


class LibraryLoadError(LlamaError, OSError):
    """A native library exists but the dynamic loader refused it (a dependency is missing, say)."""


class BackendUnavailableError(LlamaError, RuntimeError):
    """A compute backend that was required (``require_gpu=True``) did not load."""


class ClosedError(LlamaError, ValueError):
    """An object was used after ``close()``."""


class ParameterError(LlamaError, ValueError):
    """A parameter is outside what llama.cpp accepts (checked before any native call)."""


class BusyError(LlamaError, RuntimeError):
    """An object is in use by an open stream; finish or close that stream first."""


class ModelLoadError(LlamaError, ValueError):
    """llama.cpp could not load a model file."""


class ContextError(LlamaError, RuntimeError):
    """llama.cpp could not create a context with the requested parameters."""


class DecodeError(LlamaError, RuntimeError):
    """``llama_decode``/``llama_encode`` failed."""


class TokenizationError(LlamaError, ValueError):
    """Text could not be tokenized, or tokens are out of the vocabulary's range."""


class ContextOverflowError(LlamaError, ValueError):
    """The input does not fit ``n_ctx``, ``n_batch`` or ``n_ubatch``."""


class TemplateError(LlamaError, ValueError):
    """A chat template failed to render, or tried to leave its sandbox."""


class SpeculativeError(LlamaError, ValueError):
    """Speculative decoding was asked for in a way the model or context cannot serve."""


class MultimodalError(LlamaError, ValueError):
    """A multimodal input (image, audio, markers) is invalid or the projector refused it."""


class OptionalSymbolMissing(LlamaError, AttributeError):
    """An optional native symbol (e.g. the MTP staging API) is not exported by this build."""


class GrammarError(LlamaError, ValueError):
    """A GBNF grammar or JSON schema is malformed or would expand past the repetition budget."""


class CallbackError(LlamaError, RuntimeError):
    """A user callback (``logits_processor``, ``stopping_criteria``, a draft model) raised or
    returned a value of the wrong kind; the original exception is the ``__cause__``."""


class CacheError(LlamaError, OSError):
    """A prompt cache could not be created, read or written (an unwritable directory, say)."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model file does not exist (a ``ValueError`` as upstream raises, and a ``FileNotFoundError``)."""


class WorkerLostError(LlamaError, RuntimeError):
    """The worker process holding a model died (an RPC server it used went away, say); ``reload()``
    (or a new object) loads the model again."""


class NotInProcessError(LlamaError, AttributeError):
    """An in-process handle (``llm.model``, ``llm.ctx``, ``native_model()``...) was asked of a model that
    runs in a worker process (``Llama(rpc_servers=...)``); ``rpc_isolation=False`` loads in-process."""
