"""Per-object call serialization: what makes ``Llama``, ``LlamaEmbedding`` and ``MultimodalChat``
safe to share between threads.

Calls on one object run one at a time (a reentrant lock; a call from another thread waits).
A stream holds the object from its creation until it is exhausted, closed or garbage-collected;
while it is open, any other call or stream fails at once with :class:`BusyError` (waiting
could deadlock the thread that holds the stream), except the read-only ones marked
``during_stream``. Each step of a stream takes the lock, so ``close()`` from another thread waits
for the token being computed and then frees; the stream's next step raises :class:`ClosedError`.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from .._errors import BusyError, ClosedError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class CallGuard:
    """The lock and the open-stream slot of one object (``what`` names it in messages)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lock = threading.RLock()
        # weak: a stream dropped unfinished (``break`` out of a for loop) is collected and releases
        self._open: weakref.ref[GuardedStream[Any]] | None = None
        self._depth = 0  # calls in progress on the lock's owner thread (nested calls, stream steps)

    @contextmanager
    def call(self, during_stream: bool = False) -> Iterator[None]:
        with self.lock:
            if self.open_stream() is not None and self._depth == 0 and not during_stream:
                raise BusyError(f"a stream of this {self.what} is open: consume it or call its close() "
                                "before the next call (one call at a time per object)")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1

    def open_stream(self) -> GuardedStream[Any] | None:
        return self._open() if self._open is not None else None

    def stream(self, items: Iterator[T]) -> GuardedStream[T]:
        """Register ``items`` as the open stream (call inside :meth:`call`)."""
        with self.lock:
            if self.open_stream() is not None:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
                raise BusyError(f"a stream of this {self.what} is already open: consume it or call its "
                                "close() before starting another")
            s = GuardedStream(self, items)
            self._open = weakref.ref(s)
            return s

    def invalidate(self) -> None:
        """The object is closing: its open stream (if any) raises ClosedError from now on."""
        with self.lock:
            s = self.open_stream()
            if s is not None:
                s._release()  # its cleanup runs while the native objects still exist
                s.closed_by_owner = True


class GuardedStream(Generic[T]):
    """An iterator whose every step runs under its object's lock."""

    def __init__(self, guard: CallGuard, items: Iterator[T]) -> None:
        self._guard = guard
        self._items: Iterator[T] | None = items
        self.closed_by_owner = False

    def __iter__(self) -> GuardedStream[T]:
        return self

    def __next__(self) -> T:
        return self._step(None, False)

    def send(self, value: Any) -> T:
        """``generator.send(value)`` under the lock (streams over generators only)."""
        return self._step(value, True)

    def _step(self, value: Any, sending: bool) -> T:
        g = self._guard
        with g.lock:
            if self.closed_by_owner:
                raise ClosedError(f"this stream's {g.what} was closed; create a new one to continue")
            items = self._items
            if items is None:
                raise StopIteration
            if sending and not hasattr(items, "send"):
                raise TypeError("this stream does not take values: use next()")
            g._depth += 1
            try:
                return items.send(value) if sending else next(items)  # type: ignore[attr-defined]
            except BaseException:
                self._release()
                raise
            finally:
                g._depth -= 1

    def close(self) -> None:
        """Stop the stream early and free the object for the next call (idempotent)."""
        with self._guard.lock:
            self._release()

    def _release(self) -> None:
        g, items = self._guard, self._items
        self._items = None
        if g.open_stream() is self:
            g._open = None
        close = getattr(items, "close", None)
        if close is not None:
            g._depth += 1
            try:
                close()
            finally:
                g._depth -= 1

    def __del__(self) -> None:
        if self._items is not None:
            self.close()


def serialized(during_stream: bool = False) -> Callable[[F], F]:
    """Run the method under ``self._guard.call()``."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self._guard.call(during_stream):
                return fn(self, *args, **kwargs)
        return method  # type: ignore[return-value]
    return wrap
