"""Helpers shared by the low-level binding modules (``llama_cpp``, ``mtmd_cpp``, ``ggml_cpp``).

Functions are bound lazily: each module-level name is a :class:`CFunction` that resolves its
symbol (loading the libraries through :mod:`llama_cpp._native.loader`) on the first call, then puts the
raw ctypes function in its module's namespace, so later ``module.name(...)`` calls cost exactly
a ctypes call. That keeps ``import llama_cpp.llama_cpp`` cheap and library-free (the structs,
constants and signatures can be inspected, e.g. by the ABI tests and the bump tool, without a
native build), and the first call still fails loudly with the loader's error when no library is
there.

The libraries come from a *library source* the package installs at import
(:func:`set_library_source`, pointing at :mod:`llama_cpp._native.loader`): the loader routes native logs
through :mod:`llama_cpp._native.log_routing`, which uses these bindings, so the bindings must not import the
loader themselves.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import LibraryLoadError, OptionalSymbolMissing

if TYPE_CHECKING:
    from pathlib import Path

_handle_of: Callable[[str], Any] | None = None
_path_of: Callable[[str], Path | None] | None = None


def set_library_source(handle: Callable[[str], Any], path: Callable[[str], Path | None]) -> None:
    """Where bound functions find their libraries: ``handle(name)`` loads and returns the CDLL of
    ``llama``, ``ggml``, ``ggml_base`` or ``mtmd``; ``path(name)`` says which file it is."""
    global _handle_of, _path_of
    _handle_of, _path_of = handle, path


def _library_handle(name: str) -> Any:
    if _handle_of is None:
        raise LibraryLoadError("no library source is installed: import llama_cpp (its __init__ installs the loader)")
    return _handle_of(name)


def library_attributes(module: str, library: str, aliases: Sequence[str]) -> Callable[[str], Any]:
    """A binding module's ``__getattr__``: upstream's names for the loaded library (``_lib`` in
    ``llama_cpp.llama_cpp``) load it on first access and return its ``ctypes.CDLL``, whose functions
    are the same objects the bindings call."""
    names = frozenset(aliases)

    def __getattr__(name: str) -> Any:
        if name in names:
            return _library_handle(library)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


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
        handle = _library_handle(self.library)
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
                path = _path_of(self.library) if _path_of is not None else None
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
