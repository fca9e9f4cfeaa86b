"""Several API keys (``--api_key_file``), each with optional limits: tokens per minute and concurrent
requests. A request over its key's limit is answered 429 with ``Retry-After`` before it reaches a model.

The key file holds one key per line, optionally followed by its limits::

    # comments and blank lines are ignored
    sk-team-a tpm=20000 concurrent=4
    sk-team-b concurrent=1
    sk-admin

``tpm`` counts prompt and generated tokens over the last 60 seconds: a request is admitted while its key
used fewer; ``concurrent`` counts the key's requests in flight (streams until their last event).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, body_for
from .metrics import key_label

WINDOW_S = 60.0


@dataclasses.dataclass(frozen=True)
class KeyLimits:
    tpm: int | None = None  # tokens (prompt + generated) per minute
    concurrent: int | None = None  # requests in flight


def load_key_file(path: str) -> dict[str, KeyLimits]:
    """The keys of ``path`` with their limits (a clear ``ValueError`` naming the line otherwise)."""
    if not os.path.isfile(path):
        raise ValueError(f"api_key_file {path!r} not found")
    keys: dict[str, KeyLimits] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, *opts = line.split()
            limits: dict[str, int] = {}
            for opt in opts:
                name, sep, value = opt.partition("=")
                if name not in ("tpm", "concurrent") or not sep or not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{path}:{n}: {opt!r} is not a limit: write tpm=<tokens per minute> or "
                                     "concurrent=<requests>, each a positive integer")
                limits[name] = int(value)
            if key in keys:
                raise ValueError(f"{path}:{n}: the key on this line is listed twice")
            keys[key] = KeyLimits(**limits)
    if not keys:
        raise ValueError(f"api_key_file {path!r} lists no keys")
    return keys


class Quotas:
    """Each limited key's requests in flight and its tokens over the last minute (by key label)."""

    def __init__(self, limits: dict[str, KeyLimits]) -> None:
        self.limits = {key_label(k): v for k, v in limits.items() if v.tpm or v.concurrent}
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = collections.defaultdict(int)
        self._tokens: dict[str, collections.deque[tuple[float, int]]] = collections.defaultdict(collections.deque)

    def _used(self, label: str, now: float) -> int:
        q = self._tokens[label]
        while q and q[0][0] <= now - WINDOW_S:
            q.popleft()
        return sum(n for _, n in q)

    def admit(self, label: str) -> tuple[str, int] | None:
        """Take a place for a request of ``label``; None when admitted, else (which limit, seconds to wait)."""
        lim = self.limits.get(label)
        if lim is None:
            return None
        with self._lock:
            now = time.monotonic()
            if lim.concurrent is not None and self._inflight[label] >= lim.concurrent:
                return f"{lim.concurrent} concurrent requests", 1
            if lim.tpm is not None:
                q = self._tokens[label]
                used = self._used(label, now)
                if used >= lim.tpm:
                    # wait until enough of the window's tokens expire to go under the limit
                    over, wait = used - lim.tpm, WINDOW_S
                    for t, n in q:
                        over -= n
                        if over < 0:
                            wait = t + WINDOW_S - now
                            break
                    return f"{lim.tpm} tokens per minute", max(1, math.ceil(wait))
            self._inflight[label] += 1
            return None

    def release(self, label: str) -> None:
        if label in self.limits:
            with self._lock:
                self._inflight[label] -= 1

    def spent(self, label: str, tokens: int) -> None:
        if tokens > 0 and label in self.limits and self.limits[label].tpm is not None:
            with self._lock:
                self._tokens[label].append((time.monotonic(), tokens))


class QuotaGate:
    """Answers 429 (``Retry-After``) for a request whose key is over a limit; holds its place until the
    response's last byte."""

    def __init__(self, app: ASGIApp, quotas: Quotas) -> None:
        self.app = app
        self.quotas = quotas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        label = (scope.get("state") or {}).get("key_label")
        if scope["type"] != "http" or label is None or scope.get("path") == "/health":
            await self.app(scope, receive, send)
            return
        refused = self.quotas.admit(label)
        if refused is not None:
            what, wait = refused
            err = APIError(429, f"this API key is over its limit of {what}: retry after {wait} s",
                           type="rate_limit_error", code="rate_limit_exceeded")
            payload = json.dumps(body_for(err, scope.get("path", ""))).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode()),
                                    (b"retry-after", str(wait).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.quotas.release(label)


def keys_of(settings: Any) -> dict[str, KeyLimits]:
    """Every accepted key: ``api_key`` (no limits) and those of ``api_key_file``."""
    keys = load_key_file(settings.api_key_file) if settings.api_key_file else {}
    if settings.api_key is not None:
        keys.setdefault(settings.api_key, KeyLimits())
    return keys


__all__ = ["KeyLimits", "QuotaGate", "Quotas", "WINDOW_S", "keys_of", "load_key_file"]
