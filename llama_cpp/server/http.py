"""What every route shares at the HTTP level: the body limit, the API-key check, server-sent events,
and the app's state (settings, models) as seen from a request."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from typing import Any

import anyio
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, body_for
from .metrics import KeyCounters, key_label
from .models import ModelRegistry
from .settings import ServerSettings

access_log = logging.getLogger("llama_cpp.server.access")

class BodyLimit:
    """Answers 413 for a body over ``limit`` bytes before any handler reads it (declared or streamed)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, send)
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, send)
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        msg = f"the request body exceeds {self.limit} bytes (the server's max_body_bytes): send less"
        payload = json.dumps(body_for(APIError(413, msg, code="body_too_large"), scope.get("path", ""))).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def server_settings(request: Request) -> ServerSettings:
    return request.app.state.server_settings


def registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def key_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents: ``Authorization: Bearer <key>`` (OpenAI's clients) or ``x-api-key``
    (Anthropic's)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return x_api_key or None


def presented_key(request: Request) -> str | None:
    return key_from_headers(request.headers.get("authorization"), request.headers.get("x-api-key"))


class AccessLog:
    """One structured line per request on the ``llama_cpp.server.access`` logger (method, path, status,
    duration to the last byte, client, key label), and the per-key request counter. The request's key
    label is left in ``request.state.key_label`` for the token counters."""

    def __init__(self, app: ASGIApp, keys: KeyCounters) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        label = key_label(key_from_headers(headers.get("authorization"), headers.get("x-api-key")))
        scope.setdefault("state", {})["key_label"] = label
        status = 500

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        finally:
            ms = 1000 * (time.perf_counter() - t0)
            self.keys.request(label, status)
            client = scope.get("client") or ("-", 0)
            fields = {"method": scope.get("method", ""), "path": scope.get("path", ""), "status": status,
                      "duration_ms": round(ms, 1), "client": client[0], "key": label}
            access_log.info(" ".join(f"{k}={v}" for k, v in fields.items()), extra={"access": fields})


async def authenticate(request: Request) -> None:
    """One of the API keys (``api_key``, ``api_key_file``), when any is set (compared in constant time)."""
    keys: list[bytes] = request.app.state.api_keys
    if not keys:
        return
    token = presented_key(request)
    given = (token or "").encode()
    # every key compared, so that the time taken tells nothing about which one was close
    matched = [hmac.compare_digest(given, k) for k in keys]
    if token is None or not any(matched):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <api_key>' or "
                       "'x-api-key: <api_key>'", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class SSEResponse(StreamingResponse):
    """Server-sent events; the producer is cancelled as soon as the client disconnects."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            async def stream() -> None:
                with contextlib.suppress(OSError):
                    await self.stream_response(send)
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


__all__ = ["AccessLog", "BodyLimit", "SSEResponse", "authenticate", "key_from_headers", "presented_key", "registry", "server_settings"]
