"""``/v1/chat/completions``: the chat rendered as ``Llama`` renders it, run on the model's engine;
image and audio chat rendered as the model's chat handler renders it, in the slots (media encoded before
the request queues), or run by the handler on a one-at-a-time model."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from ..._safety.tool_limits import check_tools
from .. import prompts
from ..engine import GenRequest, SlotEngine, collect_stats_stream
from ..engine.media import cells
from ..errors import APIError
from ..models import ServedModel
from ..types import CreateChatCompletionRequest
from .common import (
    AUTH,
    check_limits,
    collect,
    engine_of,
    events,
    first_events,
    guarded,
    lora_scales,
    merge_choices,
    ping_interval,
    sampling,
    served_model,
    server_settings,
    sse,
    submit,
    with_index,
    work,
)

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def create_chat_completion(request: Request, body: CreateChatCompletionRequest) -> Any:
    out = await start_chat(request, body)
    if isinstance(out, dict):
        return out
    return sse(out, lambda obj: f"data: {json.dumps(obj)}\n\n".encode(), b"data: [DONE]\n\n")


class ChatStream:
    """A streamed chat completion: its ``chat.completion.chunk`` objects (None: a keep-alive tick) and
    its prompt's length in tokens (0 where the model's chat handler renders it)."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any] | None], prompt_tokens: int = 0) -> None:
        self.chunks = chunks
        self.prompt_tokens = prompt_tokens

    def __aiter__(self) -> AsyncIterator[dict[str, Any] | None]:
        return self.chunks


async def start_chat(request: Request, body: CreateChatCompletionRequest) -> dict[str, Any] | ChatStream:
    """Run a chat completion: the ``chat.completion`` or, with ``body.stream``, its :class:`ChatStream`.
    The one chat path every chat-shaped API translates onto."""
    max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
    check_limits(request, body.n, max_tokens, body.stop)
    served = await served_model(request, body.model)
    engine_of(served)  # a vocab-only model says so before its prompt is looked at
    llama = served.llama
    s = server_settings(request)
    created = int(time.time())
    model_name = body.model or served.alias
    lora = lora_scales(served, body.lora)
    if llama.chat_handler is not None and not isinstance(served.engine, SlotEngine):
        return await handler_chat(request, served, body, max_tokens)  # the handler runs the whole request
    if llama.chat_handler is not None:  # a projector model's chat in the slots: media encoded off the loop
        if body.grammar or body.logprobs:
            raise APIError(400, "grammar and logprobs are not supported with image chat yet", code="unsupported")
        chat = await asyncio.to_thread(prompts.media_chat_prompt, llama, body, served.n_ctx_slot)
    else:
        prompts.refuse_media(body.messages, served.alias)
        chat = await asyncio.to_thread(prompts.chat_prompt, llama, body, served.n_ctx_slot)  # off the loop
    n_cells = cells(chat.tokens, chat.media)
    prompts.check_prompt(llama, chat.tokens, served.n_ctx_slot, n_cells)
    limit = prompts.max_tokens(max_tokens, n_cells, served.n_ctx_slot, s.max_tokens_limit)
    stop = chat.stops + prompts.stops(body.stop)
    reqs = [GenRequest(prompt_tokens=chat.tokens, max_tokens=limit, sampling=sampling(body, llama),
                       grammar=chat.grammar, stop=stop, logprobs=(body.top_logprobs or 0) if body.logprobs else None,
                       completion_id=f"cmpl-{uuid.uuid4()}", created=created, model_name=model_name, lora=lora,
                       media=chat.media)
            for _ in range(body.n)]
    group = await submit(request, served, body.n, lambda i: work(served, reqs[i]), stream=body.stream)
    if body.stream:
        first = await first_events(request, group)
        converters = [prompts.chat_chunks(chat) for _ in reqs]
        return ChatStream(events(request, group, first, lambda i, c: [with_index(x, i) for x in converters[i](c)],
                                 ping_interval(request)), n_cells)
    parts = await collect(request, group)
    out = [prompts.chat_result(parts[i], chat) for i in range(body.n)]
    return merge_choices([with_index(o, i) for i, o in enumerate(out)])


async def handler_chat(request: Request, served: ServedModel, body: CreateChatCompletionRequest,
                       max_tokens: int | None) -> dict[str, Any] | ChatStream:
    """Image chat through the model's chat handler (one request at a time)."""
    s = server_settings(request)
    if body.grammar or body.logprobs or body.lora:
        raise APIError(400, "grammar, logprobs and lora are not supported with image chat yet", code="unsupported")
    try:
        check_tools(body.tools)
        check_tools(body.functions, "functions")
    except ValueError as exc:
        raise APIError(400, str(exc), param="tools") from exc
    limit = max_tokens if max_tokens else min(served.n_ctx_slot, s.max_tokens_limit)
    budget = body.reasoning_budget_tokens
    # tools, the response format and the chat-layer options go to the handler, which parses the model's
    # tool calls and reasoning through llama.cpp's chat layer (or refuses what its template cannot do)
    kwargs = dict(messages=body.messages, max_tokens=limit, temperature=body.temperature, top_p=body.top_p,
                  top_k=body.top_k, min_p=body.min_p, typical_p=body.typical_p, repeat_penalty=body.repeat_penalty,
                  frequency_penalty=body.frequency_penalty or 0.0, presence_penalty=body.presence_penalty or 0.0,
                  seed=body.seed, stop=body.stop, model=body.model or served.alias, tools=body.tools,
                  tool_choice=body.tool_choice, functions=body.functions, function_call=body.function_call,
                  response_format=body.response_format, parallel_tool_calls=body.parallel_tool_calls,
                  reasoning_effort=body.reasoning_effort, chat_template_kwargs=body.chat_template_kwargs,
                  reasoning_format=body.reasoning_format, reasoning_budget=None if budget in (None, -1) else budget)

    def make(_: int) -> Callable[[Any], Any]:
        # the speculative statistics of a Llama whose handler drafts on media prompts
        def run(llama: Any) -> Any:
            if served.lora is not None:  # the global scales
                served.lora.use(llama, served.lora.scales)
            return collect_stats_stream(llama, iter(llama.create_chat_completion(stream=True, **kwargs)))
        return run

    group = await submit(request, served, body.n, make, stream=body.stream)
    if body.stream:
        first = await first_events(request, group)
        return ChatStream(events(request, group, first, lambda i, c: [with_index(c, i)], ping_interval(request)))
    parts = await collect(request, group)
    out = [prompts.join_chat_chunks(parts[i]) for i in range(body.n)]
    return merge_choices([with_index(o, i) for i, o in enumerate(out)])


__all__ = ["ChatStream", "create_chat_completion", "handler_chat", "router", "start_chat"]
