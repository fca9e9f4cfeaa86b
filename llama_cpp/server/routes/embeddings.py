"""``/v1/embeddings`` (text or token-id inputs, ``dimensions``) and ``/v1/rerank`` (Jina/Cohere shape) on a
model loaded with ``embedding=true``; both embed token lists with llama.cpp's pooling in the model's engine."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from ..._core.normalize import normalize_embeddings
from ..._safety.prompt_chars import check_prompt_chars
from ...llama_cpp import LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_RANK
from ...llama_embedding import embed_token_lists, rank_token_lists
from ..errors import APIError
from ..models import ServedModel
from ..types import CreateEmbeddingRequest, RerankRequest
from .common import AUTH, collect, guarded, served_model, submit

router = APIRouter()


def _embedding_model(served: ServedModel, what: str) -> None:
    if not served.settings.embedding:
        raise APIError(400, f"the model {served.alias!r} was not loaded for {what}: start it with --embedding true",
                       code="invalid_model", param="model")


def _token_lists(served: ServedModel, inputs: list[str | list[int]]) -> list[list[int]]:
    """Each input as token ids (text tokenized as llama-embedding does), checked against the context."""
    model = served.llama.native_model()
    limit = served.n_ctx_slot
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            check_prompt_chars(model, item, limit, f"input[{i}]")
            toks = model.tokenize(item.encode("utf-8"), add_special=True, parse_special=True)
        else:
            model.check_tokens(item, f"input[{i}] token")
            toks = list(item)
        if not toks:
            raise APIError(400, f"input[{i}] is empty: embeddings need at least one token", param="input")
        if len(toks) > limit:
            raise APIError(400, f"input[{i}] has {len(toks)} tokens; the context holds {limit}: shorten it",
                           code="context_length_exceeded", param="input")
        out.append(toks)
    return out


def _embed(llama: Any, lists: list[list[int]], alias: str, rank: bool) -> dict[str, Any]:
    """``{"rows", "usage"}`` for ``lists`` on ``llama``'s context (the engine's thread), the context left
    empty after."""
    ctx = llama.native_context()
    pooling = ctx.pooling_type()
    if rank and pooling != LLAMA_POOLING_TYPE_RANK:
        raise APIError(400, f"the model {alias!r} is not a reranker (its pooling type is {pooling}, not rank): "
                       "serve a reranking model (one with a classifier head, pooling rank) for /v1/rerank",
                       code="invalid_model", param="model")
    if not rank and pooling == LLAMA_POOLING_TYPE_RANK:
        raise APIError(400, f"the model {alias!r} is a reranker (pooling rank): use /v1/rerank", code="invalid_model",
                       param="model")
    llama.reset()
    try:
        rows, counts = embed_token_lists(ctx, llama.native_model(), lists, normalize=-1, truncate=False)
    finally:
        llama.reset()
    if pooling == LLAMA_POOLING_TYPE_NONE:
        rows = [np.asarray(r) for r in rows]
    total = int(sum(counts))
    return {"rows": rows, "usage": {"prompt_tokens": total, "total_tokens": total}}


def _inputs(value: Any) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(x, int) for x in value):
        return [list(value)]
    return list(value)


@router.post("/v1/embeddings", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def create_embedding(request: Request, body: CreateEmbeddingRequest) -> Any:
    served = await served_model(request, body.model)
    _embedding_model(served, "embeddings")
    inputs = _inputs(body.input)
    if not inputs:
        raise APIError(400, "input is empty: give a string, token ids, or a non-empty list of them", param="input")
    lists = await asyncio.to_thread(_token_lists, served, inputs)
    name = body.model or served.alias
    group = await submit(request, served, 1, lambda _: (lambda llama: _embed(llama, lists, served.alias, False)))
    out = (await collect(request, group))[0][0]
    rows, total = out["rows"], out["usage"]["prompt_tokens"]
    vectors = [np.asarray(r, dtype=np.float32) for r in rows]
    if body.dimensions is not None:
        width = vectors[0].shape[-1]
        if body.dimensions > width:
            raise APIError(400, f"dimensions={body.dimensions} exceeds the model's {width}", param="dimensions")
        # Matryoshka truncation: the leading dimensions, L2-normalised again
        vectors = [normalize_embeddings(v[..., :body.dimensions], 2) for v in vectors]
    data = []
    for i, v in enumerate(vectors):
        emb: Any = (base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else v.tolist())
        data.append({"object": "embedding", "embedding": emb, "index": i})
    return {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": total, "total_tokens": total}}


@router.post("/v1/rerank", dependencies=AUTH, tags=["Extras"])
@router.post("/v1/reranking", dependencies=AUTH, include_in_schema=False)
@router.post("/rerank", dependencies=AUTH, include_in_schema=False)
@router.post("/reranking", dependencies=AUTH, include_in_schema=False)
@guarded
async def rerank(request: Request, body: RerankRequest) -> Any:
    """Scores of ``documents`` for ``query`` from a reranking model, best first (Jina's and Cohere's shape,
    as llama-server answers it; ``document`` with ``return_documents``)."""
    if body.top_n is not None and body.top_n < 1:
        raise APIError(400, f"top_n={body.top_n}: give a positive number of results (or leave it out for all)",
                       param="top_n")
    texts = []
    for i, d in enumerate(body.documents):
        text = d if isinstance(d, str) else d.get("text") if isinstance(d, dict) else None
        if not isinstance(text, str):
            raise APIError(400, f"documents[{i}] must be a string or {{\"text\": ...}}", param=f"documents[{i}]")
        texts.append(text)
    if not texts:
        raise APIError(400, "documents is empty: give at least one document", param="documents")
    served = await served_model(request, body.model)
    _embedding_model(served, "reranking")
    model = served.llama.native_model()
    lists = await asyncio.to_thread(rank_token_lists, model, body.query, texts)
    await asyncio.to_thread(_token_lists, served, lists)  # each pair within the context
    group = await submit(request, served, 1, lambda _: (lambda llama: _embed(llama, lists, served.alias, True)))
    out = (await collect(request, group))[0][0]
    rows, total = out["rows"], out["usage"]["prompt_tokens"]
    scores = np.asarray(rows, dtype=np.float64)[:, 0]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:body.top_n or len(texts)]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if body.return_documents:
            item["document"] = {"text": texts[i]}
        results.append(item)
    return {"model": body.model or served.alias, "object": "list", "results": results,
            "usage": {"prompt_tokens": total, "total_tokens": total}}


__all__ = ["create_embedding", "rerank", "router"]
