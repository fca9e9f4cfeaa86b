"""Clients sent at once: one thread per argument, released together at a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def run_together(fn: Callable[[Any], Any], args: Sequence[Any], timeout: float = 180) -> list[Any]:
    """``[fn(a) for a in args]``, each call in its own thread, all started at the same moment; the first
    error of any call is raised here (after every thread ended or timed out)."""
    out: list[Any] = [None] * len(args)
    errors: list[BaseException] = []
    go = threading.Barrier(len(args))

    def run(i: int) -> None:
        try:
            go.wait()
            out[i] = fn(args[i])
        except BaseException as exc:  # noqa: BLE001 (raised in the caller's thread below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return out
