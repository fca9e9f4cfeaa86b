"""Ownership of native objects: :class:`NativeRef` counts the users of a native pointer, :class:`Owned`
frees it exactly once (``close()``, ``with`` or a :func:`weakref.finalize` finalizer), plus ctypes helpers.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import (
    ClosedError,
)

log = logging.getLogger("llama_cpp")


def native_lib() -> Any:
    """The low-level binding module (``llama_cpp.llama_cpp``), loaded on first use."""
    from .. import llama_cpp as C
    from .._native import loader as _loader

    _loader.load()
    return C


def _as_float_ptr(ptr: Any) -> Any:
    if ptr is None:
        return None
    if isinstance(ptr, int):
        return ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
    return ptr


_FLOAT_VIEWS: dict[tuple[int, int], np.ndarray] = {}


def float_view(ptr: Any, n: int) -> np.ndarray | None:
    """A read-only NumPy view of ``n`` floats at a native address (None for NULL).

    llama.cpp hands out the same output buffers decode after decode, so views are kept by
    (address, length): making one costs more than a small model's sampling step. A view is only
    handed out for an address llama.cpp just returned, so it never outlives what it shows."""
    ptr = _as_float_ptr(ptr)
    if not ptr:
        return None
    key = (ctypes.addressof(ptr.contents), n)
    arr = _FLOAT_VIEWS.get(key)
    if arr is None:
        if len(_FLOAT_VIEWS) >= 1024:
            _FLOAT_VIEWS.clear()
        arr = np.ctypeslib.as_array(ptr, shape=(n,))
        arr.flags.writeable = False
        _FLOAT_VIEWS[key] = arr
    return arr


def cstr(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, int):
        return ctypes.string_at(value).decode("utf-8", errors="replace") if value else None
    return str(value)


class CallableInt(int):
    """An int that also answers a call with itself: ``model.n_vocab`` here, ``model.n_vocab()`` in
    llama-cpp-python's ``_internals``."""

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)


class CallableDict(dict):
    """A dict that also answers a call with a copy of itself: ``model.metadata`` here,
    ``model.metadata()`` in llama-cpp-python's ``_internals``."""

    def __call__(self) -> dict[str, str]:
        return dict(self)


class NativePointer(int):
    """A native pointer as llama-cpp-python exposes it (``Llama.model``, ``Llama.ctx``): an ``int``,
    so every ``llama_*`` call, ``ctypes.cast`` and ``ctypes.c_void_p(p)`` take it as upstream's
    ``c_void_p`` value, and it compares equal to the raw address. It also answers the owning
    wrapper's attributes (``llm.model.n_vocab``, ``llm.ctx.n_ctx()``) and holds the wrapper, so the
    native object outlives the pointer unless it is closed explicitly."""

    def __new__(cls, value: int, owner: Any) -> NativePointer:
        self = int.__new__(cls, value)
        self.__dict__["_owner"] = owner
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_owner"], name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, (int(self),))


def unwrap(obj: Any) -> Any:
    """The wrapper behind a :class:`NativePointer` (``Llama.model``, ``Llama.ctx``); anything else as is."""
    return obj.__dict__["_owner"] if isinstance(obj, NativePointer) else obj


class NativeRef:
    """Shared ownership of one native pointer.

    The pointer is freed once the owner has closed it and no dependent object (a context using a
    model, say) still holds it. Thread-safe; idempotent.
    """

    __slots__ = ("_closed", "_free", "_lock", "_parents", "_users", "name", "ptr")

    def __init__(self, ptr: Any, free: Callable[[Any], None], name: str,
                 parents: Sequence[NativeRef] = ()) -> None:
        self.ptr = ptr
        self._free = free
        self._users = 0
        self._closed = False
        self._lock = threading.Lock()
        self.name = name
        self._parents = list(parents)
        for p in self._parents:
            p.acquire()

    @property
    def parents(self) -> tuple[NativeRef, ...]:
        """The references this one holds (released when it is freed)."""
        return tuple(self._parents)

    def hold(self, parent: NativeRef) -> None:
        """Hold ``parent`` (acquired here) until this reference is freed."""
        parent.acquire()
        self._parents.append(parent)

    def acquire(self) -> None:
        with self._lock:
            if self.ptr is None:
                raise ClosedError(f"the native {self.name} was already freed")
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
        self._maybe_free()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._maybe_free()

    def _maybe_free(self) -> None:
        with self._lock:
            if not self._closed or self._users > 0 or self.ptr is None:
                return
            ptr, self.ptr = self.ptr, None
        self._free(ptr)
        parents, self._parents = self._parents, []
        for p in parents:
            p.release()


class Owned:
    """Base of the wrappers: ``close()``, context manager, finalizer, use-after-close checks."""

    _kind = "object"
    _ref: NativeRef | None
    #: the ctypes bindings (:mod:`llama_cpp.llama_cpp`'s loaded library) this wrapper calls; other modules
    #: call llama.cpp on this object's pointer through it, so one process never mixes two loaded libraries
    bindings: Any

    def _own(self, ptr: Any, free: Callable[[Any], None], parents: Sequence[NativeRef] = ()) -> None:
        self._ref = NativeRef(ptr, free, self._kind, parents)
        self._finalizer = weakref.finalize(self, self._ref.close)

    @property
    def closed(self) -> bool:
        return self._ref is None

    @property
    def native_ref(self) -> NativeRef | None:
        """The shared ownership of the native object (None once closed): what a dependent object holds
        (``NativeRef.hold``) so that this one outlives it, and what tells two wrappers of one object apart."""
        return self._ref

    def _ptr(self) -> Any:
        ref = self._ref
        if ref is None or ref.ptr is None:
            raise ClosedError(f"this {self._kind} is closed; create a new one")
        return ref.ptr

    @property
    def ptr(self) -> Any:
        """The raw native pointer, for a llama.cpp call on this object or a struct field that names it
        (:class:`ClosedError` once closed). It does not keep the object alive: a dependent object holds
        :attr:`native_ref` for that."""
        return self._ptr()

    def pointer(self) -> NativePointer:
        """The native pointer as upstream exposes it (``Llama.model``, ``Llama.ctx``): see :class:`NativePointer`."""
        return NativePointer(self._ptr(), self)

    def close(self) -> None:
        """Free the native object (deferred while dependents still use it). Idempotent."""
        ref, self._ref = getattr(self, "_ref", None), None
        if ref is not None:
            self._finalizer.detach()
            ref.close()

    def __enter__(self):
        self._ptr()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# upstream's module path for these classes (reprs, pickles): llama_cpp._internals re-exports them
for _cls in (CallableInt, CallableDict, NativePointer):
    _cls.__module__ = "llama_cpp._internals"
