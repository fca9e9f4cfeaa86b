"""``/v1/completions``: text or token prompts, ``n`` choices each, on the model's engine."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from ..._generation import responses
from .. import prompts
from ..engine import GenRequest, SlotEngine
from ..errors import APIError
from ..types import CreateCompletionRequest
from .common import (
    AUTH,
    check_limits,
    collect,
    engine_of,
    first_events,
    guarded,
    lora_scales,
    merge_choices,
    sampling,
    served_model,
    server_settings,
    stream,
    submit,
    with_index,
    work,
)

router = APIRouter()


@router.post("/v1/completions", dependencies=AUTH, tags=["OpenAI V1"])
@router.post("/v1/engines/copilot-codex/completions", dependencies=AUTH, include_in_schema=False)
@guarded
async def create_completion(request: Request, body: CreateCompletionRequest) -> Any:
    check_limits(request, body.n, body.max_tokens, body.stop)
    served = await served_model(request, body.model)
    engine_of(served)  # a vocab-only model says so before its prompt is looked at
    llama = served.llama
    plist = prompts.prompt_list(body.prompt)
    s = server_settings(request)
    if len(plist) > s.max_prompts:
        raise APIError(400, f"{len(plist)} prompts exceed this server's limit of {s.max_prompts} per request",
                       code="invalid_value", param="prompt")
    if body.echo and body.logprobs is not None and isinstance(served.engine, SlotEngine):
        raise APIError(400, "echo with logprobs (scores of the prompt's tokens) is not available from parallel "
                       f"slots; the model {served.alias!r} runs {served.engine.n_slots}: ask without echo, or "
                       "serve the model with n_parallel=0", code="invalid_value", param="echo")
    lora = lora_scales(served, body.lora)
    created = int(time.time())
    model_name = body.model or served.alias

    def requests() -> list[GenRequest]:  # tokenizing and grammar parsing: off the event loop
        grammar = prompts.grammar(body.grammar)
        out: list[GenRequest] = []
        for p in plist:
            toks = prompts.completion_tokens(llama, p, body.suffix, served.n_ctx_slot)
            prompts.check_prompt(llama, toks, served.n_ctx_slot)
            max_tokens = prompts.max_tokens(body.max_tokens, len(toks), served.n_ctx_slot, s.max_tokens_limit)
            for _ in range(body.n):
                out.append(GenRequest(
                    prompt_tokens=toks, max_tokens=max_tokens, sampling=sampling(body, llama), grammar=grammar,
                    stop=prompts.stops(body.stop), logprobs=body.logprobs, echo=body.echo,
                    completion_id=f"cmpl-{uuid.uuid4()}", created=created, model_name=model_name,
                    prompt_chars=len(p) if isinstance(p, str) and body.suffix is None else None, lora=lora))
        return out

    reqs = await asyncio.to_thread(requests)
    group = await submit(request, served, len(reqs), lambda i: work(served, reqs[i]), stream=body.stream)
    if body.stream:
        first = await first_events(request, group)
        return stream(request, group, first, lambda i, c: [with_index(c, i)])
    parts = await collect(request, group)
    joined = [responses.join_chunks(parts[i]) for i in range(len(reqs))]
    return merge_choices([dict(with_index(j, i)) for i, j in enumerate(joined)])


__all__ = ["create_completion", "router"]
