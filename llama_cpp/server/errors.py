"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``, and under
Anthropic's routes (``/v1/messages``) in Anthropic's: ``{"type": "error", "error": {"type", "message"}}``.

Handlers map exceptions to statuses: :class:`APIError` carries its own; request validation is
422 (a body that is not JSON at all is 400); the runtime's input errors (``ValueError`` and the
``LlamaError`` subclasses that are ``ValueError``) are 400; anything else is 500 with a generic
message, its traceback only in the server log.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from .._errors import ContextOverflowError, WorkerLostError
from .engine import Cancelled, QueueFull, ShuttingDown

log = logging.getLogger("llama_cpp.server")


class APIError(Exception):
    """An error answered as ``status`` with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}


def error_body(message: str, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# Anthropic's error types by HTTP status (its API reference, "Errors")
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
_ANTHROPIC_PATHS = re.compile(r"/v1/messages(/|$)")


def anthropic_shape(path: str) -> bool:
    """Whether errors on ``path`` are answered in Anthropic's shape (its Messages API)."""
    return _ANTHROPIC_PATHS.search(path) is not None


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500
                                                                    else "invalid_request_error"),
                                       "message": message}}


def body_for(exc: APIError, path: str = "") -> dict[str, Any]:
    """The error body of ``exc`` in the shape of the API ``path`` belongs to."""
    if anthropic_shape(path):
        return anthropic_error_body(exc.status, exc.message)
    return error_body(exc.message, exc.type, exc.code, exc.param)


def error_response(exc: APIError, path: str = "") -> JSONResponse:
    return JSONResponse(body_for(exc, path), status_code=exc.status, headers=exc.headers)


def as_api_error(exc: BaseException) -> APIError:
    """The :class:`APIError` an exception from request handling stands for."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFull):
        return APIError(429, str(exc), type="server_busy", code="queue_full",
                        headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, (ShuttingDown, Cancelled)):
        return APIError(503, str(exc), type="server_error", code="unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, WorkerLostError):  # a model's worker process died (an RPC server lost): reloaded next request
        return APIError(503, str(exc), type="server_error", code="model_unavailable", headers={"Retry-After": "1"})
    if isinstance(exc, ContextOverflowError):
        return APIError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return APIError(400, str(exc), code="invalid_value")
    log.error("internal error while handling a request", exc_info=exc)
    return APIError(500, "internal server error (the server log has the details)", type="server_error",
                    code="internal_error")


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    parts = []
    param = None
    for e in errors[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        param = param or where
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more, param


def install(app: FastAPI) -> None:
    """Register the handlers that give every error OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            e = next(e for e in errors if e.get("type") == "json_invalid")
            detail = (e.get("ctx") or {}).get("error", "")
            return error_response(APIError(400, f"the request body is not valid JSON: {detail}".rstrip(": "),
                                           code="invalid_json"), request.url.path)
        msg, param = _validation_message(errors)
        # Anthropic answers a malformed body 400 (invalid_request_error); OpenAI-shaped routes keep 422
        status = 400 if anthropic_shape(request.url.path) else 422
        return error_response(APIError(status, msg, code="invalid_request", param=param), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, str(exc.detail), type=kind,
                                       headers=dict(exc.headers or {})), request.url.path)

    @app.exception_handler(Exception)
    async def _any(request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_api_error(exc), request.url.path)


def sse_error(exc: BaseException) -> bytes:
    """An error event for a stream that already started (its status line is gone)."""
    e = as_api_error(exc)
    return f"data: {json.dumps(error_body(e.message, e.type, e.code, e.param))}\n\n".encode()


__all__ = ["APIError", "anthropic_error_body", "anthropic_shape", "as_api_error", "body_for", "error_body",
           "error_response", "install", "sse_error"]
