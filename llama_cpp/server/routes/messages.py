"""``/v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API, translated onto the chat
completion path (:mod:`llama_cpp.server.convert.messages`); errors in Anthropic's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from .. import prompts
from ..convert import messages as convert
from ..errors import APIError, anthropic_error_body, as_api_error
from ..types import CountMessageTokensRequest, CreateChatCompletionRequest, CreateMessageRequest
from .chat import ChatStream, start_chat
from .common import AUTH, ClientGone, guarded, registry, served_model, sse

router = APIRouter()


def _sse_error(exc: BaseException) -> bytes:
    e = as_api_error(exc)
    return f"event: error\ndata: {json.dumps(anthropic_error_body(e.status, e.message))}\n\n".encode()


@router.post("/v1/messages", dependencies=AUTH, tags=["Anthropic"])
@guarded
async def create_message(request: Request, body: CreateMessageRequest) -> Any:
    chat_body = CreateChatCompletionRequest(**convert.chat_request(body))
    out = await start_chat(request, chat_body)
    if isinstance(out, dict):
        return convert.message(out)
    conv = convert.MessageEvents(body.model or registry(request).get(body.model).alias, out.prompt_tokens)
    return sse(message_events(conv, out), convert.sse_event, error=_sse_error)


async def message_events(conv: convert.MessageEvents, chunks: ChatStream) -> AsyncIterator[dict[str, Any] | None]:
    """Anthropic's events of a chat chunk stream; a failure after the start is an ``error`` event."""
    for ev in conv.start():
        yield ev
    try:
        async for c in chunks:
            if c is None:
                yield {"type": "ping"}  # Anthropic's keep-alive event
                continue
            for ev in conv.chunk(c):
                yield ev
    except ClientGone:
        raise
    for ev in conv.finish_events():
        yield ev


@router.post("/v1/messages/count_tokens", dependencies=AUTH, tags=["Anthropic"])
@guarded
async def count_message_tokens(request: Request, body: CountMessageTokensRequest) -> dict[str, int]:
    """The prompt's tokens as the model's template renders the messages, system and tools."""
    tools = convert.chat_tools(body.tools)
    choice, parallel = convert.chat_tool_choice(body.tool_choice, tools)
    chat_body = CreateChatCompletionRequest(model=body.model, messages=convert.messages_from_request(
        body.system, body.messages), tools=tools, tool_choice=choice if tools else None, parallel_tool_calls=parallel,
        chat_template_kwargs=body.chat_template_kwargs)
    served = await served_model(request, body.model)
    prompts.refuse_media(chat_body.messages, served.alias)
    if served.llama.chat_handler is not None:
        raise APIError(400, f"the model {served.alias!r} renders chats through its chat handler (images): "
                       "count_tokens cannot count its media tokens", param="model")
    chat = await asyncio.to_thread(prompts.chat_prompt, served.llama, chat_body, served.n_ctx_slot)
    return {"input_tokens": len(chat.tokens)}


__all__ = ["count_message_tokens", "create_message", "message_events", "router"]
