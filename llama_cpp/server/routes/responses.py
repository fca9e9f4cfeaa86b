"""``/v1/responses``: OpenAI's Responses API, translated onto the chat completion path
(:mod:`llama_cpp.server.convert.responses`); stateless (nothing is stored)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from ..convert import responses as convert
from ..errors import as_api_error
from ..types import CreateChatCompletionRequest, CreateResponseRequest
from .chat import ChatStream, start_chat
from .common import AUTH, ClientGone, guarded, registry, sse

router = APIRouter()


def token_counter(request: Request, model: str | None) -> Callable[[str], int]:
    """Tokens of a text under ``model`` (for usage details such as reasoning tokens)."""
    served = registry(request).get(model)

    def count(text: str) -> int:
        return len(served.llama.native_model().tokenize(text.encode("utf-8"), add_special=False, parse_special=False))
    return count


@router.post("/v1/responses", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def create_response(request: Request, body: CreateResponseRequest) -> Any:
    chat_body = CreateChatCompletionRequest(**convert.chat_request(body))
    out = await start_chat(request, chat_body)
    count = token_counter(request, body.model)
    if isinstance(out, dict):
        return convert.response(body, out, count)
    events = convert.ResponseEvents(body, body.model or registry(request).get(body.model).alias, count)
    return sse(response_events(events, out), convert.sse_event)


async def response_events(conv: convert.ResponseEvents, chunks: ChatStream) -> AsyncIterator[dict[str, Any] | None]:
    """The Responses events of a chat chunk stream; a failure after the start is an ``error`` event."""
    for ev in conv.start():
        yield ev
    try:
        async for c in chunks:
            if c is None:
                yield None  # keep-alive
                continue
            for ev in conv.chunk(c):
                yield ev
    except ClientGone:
        raise
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is an event
        yield conv.error(as_api_error(exc))
        return
    for ev in conv.finish():
        yield ev


__all__ = ["create_response", "response_events", "router", "token_counter"]
