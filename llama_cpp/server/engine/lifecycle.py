"""Shutdown shared by both engines: stop accepting, drain for a while, cancel the rest, free."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from .jobs import Cancelled

log = logging.getLogger("llama_cpp.server")


class Lifecycle:
    """Shutdown shared by both engines (their ``_cv``, ``_accepting``, ``_waiting``, ``_stop``,
    ``_thread`` and ``busy``); each says how to cancel what runs and what to free."""

    _cv: threading.Condition
    _accepting: bool
    _waiting: collections.deque[Any]
    _stop: bool
    _thread: threading.Thread

    @property
    def busy(self) -> int:
        raise NotImplementedError

    def _cancel_running(self) -> None:
        raise NotImplementedError

    def _free(self) -> None:
        raise NotImplementedError

    def drain(self, timeout: float) -> None:
        """Stop accepting, let running and queued requests finish for ``timeout`` s, cancel the rest."""
        with self._cv:
            self._accepting = False
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._cv:
            for job, _ in self._waiting:
                job.put("error", Cancelled("the server shut down before this request started"))
            self._waiting.clear()
            self._cancel_running()
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def close(self) -> None:
        if self._thread.is_alive():
            self.drain(0)
        if self._thread.is_alive():
            # still inside a decode after the join timeout: freeing the context now would pull it
            # out from under llama_decode; leaking it until exit is the safe choice
            log.error("the engine thread did not stop; its context is left allocated")
            return
        self._free()


__all__ = ["Lifecycle"]
