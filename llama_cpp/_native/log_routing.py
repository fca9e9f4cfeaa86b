"""Route the native log callbacks (llama.cpp, ggml, mtmd) into :mod:`logging`.

Loggers: ``llama_cpp.native`` (llama.cpp and ggml) and ``llama_cpp.native.mtmd`` (libmtmd and its
helpers). ggml levels map to DEBUG/INFO/WARNING/ERROR; ``GGML_LOG_LEVEL_CONT`` pieces (progress
dots, partial lines) are joined to the message they continue and emitted once the line ends.
Nothing is written to stdout/stderr by this module: with no handler configured, Python's
last-resort handler shows WARNING and above only, as for any library logger.

The ctypes callback objects are module globals, so they live as long as the interpreter; at exit
the callbacks stop forwarding (native code may log from static destructors after ``logging`` is
torn down).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import threading
from collections.abc import Iterator
from typing import Any

from ..ggml_cpp import (
    GGML_LOG_LEVEL_CONT,
    GGML_LOG_LEVEL_DEBUG,
    GGML_LOG_LEVEL_ERROR,
    GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_NONE,
    GGML_LOG_LEVEL_WARN,
    ggml_log_callback,
)

NATIVE = "llama_cpp.native"
MTMD = "llama_cpp.native.mtmd"

LEVELS = {
    GGML_LOG_LEVEL_NONE: logging.INFO,
    GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    GGML_LOG_LEVEL_INFO: logging.INFO,
    GGML_LOG_LEVEL_WARN: logging.WARNING,
    GGML_LOG_LEVEL_ERROR: logging.ERROR,
}


class NativeLogRouter:
    """Joins continuation pieces and forwards complete lines to one logger."""

    def __init__(self, logger_name: str) -> None:
        self.logger = logging.getLogger(logger_name)
        self._lock = threading.Lock()
        self._buf: list[str] = []
        self._level = logging.INFO
        self._enabled = True
        self.active = True
        self._captures: dict[int, list[str]] = {}
        self._captured_level = False

    @contextlib.contextmanager
    def capture_problems(self) -> Iterator[list[str]]:
        """Collect this thread's WARNING/ERROR text while the block runs, whatever the logger level."""
        lines: list[str] = []
        ident = threading.get_ident()
        with self._lock:
            self._captures[ident] = lines
        try:
            yield lines
        finally:
            with self._lock:
                self._captures.pop(ident, None)

    def _capture_locked(self, level: int, text: str) -> None:
        lines = self._captures.get(threading.get_ident())
        if lines is None:
            return
        if level != GGML_LOG_LEVEL_CONT:
            self._captured_level = level in (GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR)
        if self._captured_level and text.strip():
            lines.append(text.strip())

    def handle(self, level: int, text: str) -> None:
        """Feed one native log call (``level`` is a ``GGML_LOG_LEVEL_*``)."""
        with self._lock:
            if self._captures:
                self._capture_locked(level, text)
            if level == GGML_LOG_LEVEL_CONT:
                # joins the pending message; after a flushed line it starts one at the same level
                if not self._enabled:
                    return
                self._buf.append(text)
            else:
                self._flush_locked()
                self._level = LEVELS.get(level, logging.INFO)
                self._enabled = self.logger.isEnabledFor(self._level)
                if not self._enabled:
                    return
                self._buf.append(text)
            if self._buf and self._buf[-1].endswith("\n"):
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._buf:
            return
        msg = "".join(self._buf).rstrip("\n")
        self._buf.clear()
        if msg and self._enabled:
            self.logger.log(self._level, "%s", msg)


_routers = {NATIVE: NativeLogRouter(NATIVE), MTMD: NativeLogRouter(MTMD)}


def _make_callback(router: NativeLogRouter) -> Any:
    def callback(level: int, text: bytes | None, user_data: Any) -> None:
        if not router.active or text is None:
            return
        try:
            router.handle(level, text.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001, S110 - never let an exception cross back into C
            pass

    return ggml_log_callback(callback)


_callbacks = {name: _make_callback(r) for name, r in _routers.items()}
_installed: set[str] = set()


def install(llama: ctypes.CDLL | None, mtmd: ctypes.CDLL | None = None) -> None:
    """Point ``llama_log_set`` (which also sets ggml's) and mtmd's log setters at the routers."""
    if llama is not None and "llama" not in _installed:
        f = llama.llama_log_set
        f.argtypes = [ggml_log_callback, ctypes.c_void_p]
        f.restype = None
        f(_callbacks[NATIVE], None)
        _installed.add("llama")
    if mtmd is not None and "mtmd" not in _installed:
        for name in ("mtmd_helper_log_set", "mtmd_log_set"):  # the helper's setter also sets mtmd's
            try:
                f = getattr(mtmd, name)
            except AttributeError:
                continue
            f.argtypes = [ggml_log_callback, ctypes.c_void_p]
            f.restype = None
            f(_callbacks[MTMD], None)
            _installed.add("mtmd")
            break


def router(name: str = NATIVE) -> NativeLogRouter:
    return _routers[name]


def _shutdown() -> None:
    for r in _routers.values():
        r.flush()
        r.active = False


atexit.register(_shutdown)
