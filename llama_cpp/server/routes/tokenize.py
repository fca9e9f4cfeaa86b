"""upstream's extras: ``/extras/tokenize``, ``/extras/tokenize/count`` and ``/extras/detokenize``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from .. import prompts
from ..types import (
    DetokenizeInputRequest,
    DetokenizeInputResponse,
    TokenizeInputCountResponse,
    TokenizeInputRequest,
    TokenizeInputResponse,
)
from .common import AUTH, guarded, served_model

router = APIRouter()


@router.post("/extras/tokenize", dependencies=AUTH, tags=["Extras"])
@guarded
async def tokenize(request: Request, body: TokenizeInputRequest) -> TokenizeInputResponse:
    served = await served_model(request, body.model)
    return TokenizeInputResponse(tokens=await asyncio.to_thread(prompts.tokenize, served.llama, body.input))


@router.post("/extras/tokenize/count", dependencies=AUTH, tags=["Extras"])
@guarded
async def count_tokens(request: Request, body: TokenizeInputRequest) -> TokenizeInputCountResponse:
    served = await served_model(request, body.model)
    return TokenizeInputCountResponse(
        count=len(await asyncio.to_thread(prompts.tokenize, served.llama, body.input)))


@router.post("/extras/detokenize", dependencies=AUTH, tags=["Extras"])
@guarded
async def detokenize(request: Request, body: DetokenizeInputRequest) -> DetokenizeInputResponse:
    served = await served_model(request, body.model)
    model = served.llama.native_model()
    model.check_tokens(body.tokens, "tokens entry")
    return DetokenizeInputResponse(text=model.detokenize(body.tokens).decode("utf-8", errors="replace"))


__all__ = ["count_tokens", "detokenize", "router", "tokenize"]
