"""Helpers shared by the low-level binding modules (``llama_cpp``, ``mtmd_cpp``, ``ggml_cpp``).

Functions are bound lazily: each module-level name is a :class:`CFunction` that resolves its
symbol (loading the libraries through :mod:`llama_cpp._loader`) on the first call, then puts the
raw ctypes function in its module's namespace, so later ``module.name(...)`` calls cost exactly
a ctypes call. That keeps ``import llama_cpp.llama_cpp`` cheap and library-free (the structs,
constants and signatures can be inspected, e.g. by the ABI tests and the bump tool, without a
native build), and the first call still fails loudly with the loader's error when no library is
there.

The module also holds the thin helpers that turn NULL returns of constructors into exceptions.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._errors import (
    ContextError,
    LibraryLoadError,
    LlamaError,
    ModelLoadError,
    MultimodalError,
    OptionalSymbolMissing,
)

# A ctypes pointer, array, byref() result or None: what pointer arguments accept.
CPointer = Any


class CFunction:
    """A C function bound by name: ``argtypes``/``restype`` known now, symbol resolved on first call."""

    def __init__(
        self,
        name: str,
        library: str,
        argtypes: Sequence[Any],
        restype: Any,
        *,
        symbols: Sequence[str] | None = None,
        deprecated: str | None = None,
        optional: bool = False,
        doc: str | None = None,
        module: str = "",
        namespace: dict[str, Any] | None = None,
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc
        self.__module__ = module
        self.library = library
        self.symbols = tuple(symbols or (name,))
        self.argtypes = list(argtypes)
        self.restype = restype
        self.deprecated = deprecated
        self.optional = optional
        self._fn: Any = None
        self._namespace = namespace
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "resolved" if self._fn is not None else "unresolved"
        return f"<C function {self.__name__} ({self.library}, {state})>"

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is None:
            fn = self.resolve()
        return fn(*args)

    def find(self) -> Any | None:
        """The ctypes function from the loaded library, or None when no symbol name is exported."""
        from . import _loader

        handle = _loader.library_handle(self.library)
        for sym in self.symbols:
            try:
                fn = getattr(handle, sym)
            except AttributeError:
                continue
            fn.argtypes = self.argtypes
            fn.restype = self.restype
            return fn
        return None

    def available(self) -> bool:
        """Whether the library exports this function (loads the libraries)."""
        if self._fn is not None:
            return True
        return self.find() is not None

    def resolve(self) -> Any:
        """Look the symbol up (loading the libraries first); raise if it is not exported."""
        with self._lock:
            if self._fn is not None:
                return self._fn
            fn = self.find()
            if fn is None:
                from . import _loader

                path = _loader.library_path(self.library)
                if self.optional:
                    raise OptionalSymbolMissing(
                        f"{self.__name__} is not exported by {path} (looked for {', '.join(self.symbols)}): "
                        "this build of llama.cpp lacks the staging API; use a build from the pinned source "
                        "or avoid the feature that needs it"
                    )
                raise LibraryLoadError(
                    f"{self.__name__} is not exported by {path}: the native library does not match these "
                    "bindings; reinstall llama-cpp-python or point LLAMA_CPP_LIB_PATH at a matching build"
                )
            if self.deprecated:
                warnings.warn(f"{self.__name__} is deprecated in llama.cpp: {self.deprecated}",
                              DeprecationWarning, stacklevel=3)
            self._fn = fn
            if self._namespace is not None and self._namespace.get(self.__name__) is self:
                self._namespace[self.__name__] = fn
            return fn


class BindingSet:
    """The functions one low-level module binds, by C name (also used by the ABI tests)."""

    def __init__(self, module: str, namespace: dict[str, Any]) -> None:
        self.module = module
        self.namespace = namespace
        self.functions: dict[str, CFunction] = {}

    def _add(self, fn: CFunction) -> CFunction:
        if fn.__name__ in self.functions:
            raise ValueError(f"{fn.__name__} bound twice in {self.module}")
        self.functions[fn.__name__] = fn
        return fn

    def function(self, library: str, argtypes: Sequence[Any], restype: Any, *,
                 deprecated: str | None = None) -> Callable[[Callable[..., Any]], CFunction]:
        """Decorator: the decorated stub's name is the C symbol, its docstring the documentation."""

        def wrap(stub: Callable[..., Any]) -> CFunction:
            return self._add(CFunction(stub.__name__, library, argtypes, restype, deprecated=deprecated,
                                       doc=stub.__doc__, module=self.module, namespace=self.namespace))

        return wrap

    def optional(self, library: str, symbols: Sequence[str], argtypes: Sequence[Any],
                 restype: Any) -> Callable[[Callable[..., Any]], CFunction]:
        """Decorator for an optional symbol exported under (possibly mangled) ``symbols``."""

        def wrap(stub: Callable[..., Any]) -> CFunction:
            return self._add(CFunction(stub.__name__, library, argtypes, restype, symbols=symbols,
                                       optional=True, doc=stub.__doc__, module=self.module,
                                       namespace=self.namespace))

        return wrap

    def required(self) -> list[CFunction]:
        return [f for f in self.functions.values() if not f.optional]

    def optionals(self) -> list[CFunction]:
        return [f for f in self.functions.values() if f.optional]

    def resolve_all(self) -> None:
        """Resolve every required function now (fails on the first one missing)."""
        for f in self.required():
            f.resolve()


def byref_or_null(obj: Any) -> Any:
    return None if obj is None else ctypes.byref(obj)


# --------------------------------------------------------------------------------------------
# NULL-checking constructors (the ownership wrappers above this layer build on these)
# --------------------------------------------------------------------------------------------


def _path_bytes(path: str | os.PathLike[str]) -> bytes:
    p = os.fspath(path)
    if "\0" in p:
        raise ValueError(f"path contains a NUL character: {p!r}")
    return os.fsencode(p)


def _check_file(path: str | os.PathLike[str], what: str, error: type[LlamaError]) -> None:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise error(f"{what} {p!r} does not exist: check the path")
    if os.path.isdir(p):
        raise error(f"{what} {p!r} is a directory: pass the path of a .gguf file")


def model_load_from_file(path: str | os.PathLike[str], params: Any = None) -> int:
    """``llama_model_load_from_file`` that raises :class:`ModelLoadError` (naming the path) on NULL."""
    from . import llama_cpp as C

    _check_file(path, "model file", ModelLoadError)
    if params is None:
        params = C.llama_model_default_params()
    model = C.llama_model_load_from_file(_path_bytes(path), params)
    if not model:
        raise ModelLoadError(
            f"llama.cpp could not load the model {os.fspath(path)!r}: the file is not a GGUF model this "
            "version supports, or is truncated (see the llama_cpp.native log for the reason)"
        )
    return model


def model_load_from_splits(paths: Iterable[str | os.PathLike[str]], params: Any = None) -> int:
    """``llama_model_load_from_splits`` raising :class:`ModelLoadError` on NULL."""
    from . import llama_cpp as C

    items = [os.fspath(p) for p in paths]
    if not items:
        raise ModelLoadError("no split files given: pass the paths of all parts, in order")
    for p in items:
        _check_file(p, "model split", ModelLoadError)
    if params is None:
        params = C.llama_model_default_params()
    arr = (ctypes.c_char_p * len(items))(*(_path_bytes(p) for p in items))
    model = C.llama_model_load_from_splits(arr, len(items), params)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load the model from splits {items!r}")
    return model


def init_from_model(model: int, params: Any = None) -> int:
    """``llama_init_from_model`` raising :class:`ContextError` on NULL."""
    from . import llama_cpp as C

    if not model:
        raise ContextError("cannot create a context from a NULL model: load the model first")
    if params is None:
        params = C.llama_context_default_params()
    ctx = C.llama_init_from_model(model, params)
    if not ctx:
        raise ContextError(
            f"llama.cpp could not create a context (n_ctx={params.n_ctx}, n_batch={params.n_batch}, "
            f"n_ubatch={params.n_ubatch}, n_seq_max={params.n_seq_max}): out of memory or invalid "
            "parameters (see the llama_cpp.native log)"
        )
    return ctx


def adapter_lora_init(model: int, path: str | os.PathLike[str]) -> int:
    """``llama_adapter_lora_init`` raising :class:`ModelLoadError` on NULL."""
    from . import llama_cpp as C

    _check_file(path, "LoRA adapter", ModelLoadError)
    adapter = C.llama_adapter_lora_init(model, _path_bytes(path))
    if not adapter:
        raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {os.fspath(path)!r} for this model")
    return adapter


def sampler_chain_init(params: Any = None) -> Any:
    """``llama_sampler_chain_init`` raising :class:`LlamaError` on NULL."""
    from . import llama_cpp as C

    if params is None:
        params = C.llama_sampler_chain_default_params()
    chain = C.llama_sampler_chain_init(params)
    if not chain:
        raise LlamaError("llama_sampler_chain_init returned NULL (out of memory)")
    return chain


def batch_ext_init(ctx: int) -> int:
    """``llama_batch_ext_init`` raising :class:`ContextError` on NULL."""
    from . import llama_cpp as C

    if not ctx:
        raise ContextError("cannot create an extended batch for a NULL context")
    batch = C.llama_batch_ext_init(ctx)
    if not batch:
        raise ContextError("llama_batch_ext_init returned NULL")
    return batch


def mtmd_init_from_file(path: str | os.PathLike[str], model: int, params: Any = None) -> int:
    """``mtmd_init_from_file`` raising :class:`MultimodalError` (naming the projector) on NULL."""
    from . import mtmd_cpp as M

    _check_file(path, "multimodal projector", MultimodalError)
    if not model:
        raise MultimodalError("cannot load a projector for a NULL text model: load the model first")
    if params is None:
        params = M.mtmd_context_params_default()
    ctx = M.mtmd_init_from_file(_path_bytes(path), model, params)
    if not ctx:
        raise MultimodalError(
            f"libmtmd could not load the projector {os.fspath(path)!r}: not an mmproj GGUF, or it does not "
            "match the text model (see the llama_cpp.native.mtmd log)"
        )
    return ctx


def mtmd_bitmap_init(nx: int, ny: int, rgb: bytes | bytearray | memoryview) -> int:
    """``mtmd_bitmap_init`` from packed RGB bytes, with the size checked before calling C."""
    from . import mtmd_cpp as M

    if nx <= 0 or ny <= 0:
        raise MultimodalError(f"image size must be positive, got {nx}x{ny}")
    data = bytes(rgb)
    if len(data) != nx * ny * 3:
        raise MultimodalError(f"RGB buffer has {len(data)} bytes, expected {nx}*{ny}*3 = {nx * ny * 3}")
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bitmap = M.mtmd_bitmap_init(nx, ny, buf)
    if not bitmap:
        raise MultimodalError("mtmd_bitmap_init returned NULL")
    return bitmap


def mtmd_input_chunks_init() -> int:
    """``mtmd_input_chunks_init`` raising :class:`MultimodalError` on NULL."""
    from . import mtmd_cpp as M

    chunks = M.mtmd_input_chunks_init()
    if not chunks:
        raise MultimodalError("mtmd_input_chunks_init returned NULL")
    return chunks
