"""``/v1/embeddings`` (text or token-id inputs, ``dimensions``) and ``/v1/rerank`` (Jina/Cohere shape) on a
model loaded with ``embedding=true``; both embed token lists with llama.cpp's pooling in the model's engine.

On a model served with a projector too (``clip_model_path``), an input may hold media in llama-server's two
shapes: ``{"prompt_string": "... <__media__> ...", "multimodal_data": ["<base64>", ...]}`` (one marker per
item, images or audio) and ``{"content": [{"type": "text", ...}, {"type": "image_url", ...},
{"type": "input_audio", ...}]}`` (OpenAI's content parts; ``image_url`` a ``data:`` URL, or a file under
``media_dirs``). Such a request is embedded through the projector (``MTMDEmbeddingHandler``: text and media
chunks pooled together as the model pools); ``{"prompt_string": ...}`` alone is text on any model.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from ..._core.normalize import normalize_embeddings
from ..._errors import ContextOverflowError, MultimodalError
from ..._safety.media_policy import MediaPolicy, image_dimensions
from ..._safety.prompt_chars import check_prompt_chars
from ...llama_cpp import LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_RANK
from ...llama_embedding import embed_token_lists, rank_token_lists
from ...mtmd import Audio, Image, MarkerPrompt
from ..engine.embeddings import EmbeddingEngine, EmbedRequest
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


def _check_pooling(llama: Any, alias: str, rank: bool) -> None:
    """A 400 for a reranking request to a model that does not rank, or an embedding request to one that does."""
    pooling = llama.native_context().pooling_type()
    if rank and pooling != LLAMA_POOLING_TYPE_RANK:
        raise APIError(400, f"the model {alias!r} is not a reranker (its pooling type is {pooling}, not rank): "
                       "serve a reranking model (one with a classifier head, pooling rank) for /v1/rerank",
                       code="invalid_model", param="model")
    if not rank and pooling == LLAMA_POOLING_TYPE_RANK:
        raise APIError(400, f"the model {alias!r} is a reranker (pooling rank): use /v1/rerank", code="invalid_model",
                       param="model")


def _embed(llama: Any, lists: list[list[int]]) -> dict[str, Any]:
    """``{"rows", "usage"}`` for ``lists`` on ``llama``'s context (a one-at-a-time engine's thread), the context
    left empty after."""
    ctx = llama.native_context()
    pooling = ctx.pooling_type()
    llama.reset()
    try:
        rows, counts = embed_token_lists(ctx, llama.native_model(), lists, normalize=-1, truncate=False)
    finally:
        llama.reset()
    if pooling == LLAMA_POOLING_TYPE_NONE:
        rows = [np.asarray(r) for r in rows]
    total = int(sum(counts))
    return {"rows": rows, "usage": {"prompt_tokens": total, "total_tokens": total}}


def _work(served: ServedModel, lists: list[list[int]]) -> Any:
    """What the model's engine runs for ``lists``: a request batched with others' (EmbeddingEngine) or a call."""
    if isinstance(served.engine, EmbeddingEngine):
        return EmbedRequest(lists)
    return lambda llama: _embed(llama, lists)


def _inputs(value: Any) -> list[Any]:
    if isinstance(value, (str, dict)):
        return [value]
    if value and all(isinstance(x, int) for x in value):
        return [list(value)]
    return list(value)


def _bad(message: str, param: str = "input") -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def _decode_b64(data: Any, where: str) -> bytes:
    if not isinstance(data, str):
        raise _bad(f"{where} must be a base64 string", where)
    try:
        return base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise _bad(f"{where} is not valid base64 ({exc})", where) from None


def _media_bytes(data: bytes, policy: MediaPolicy, where: str) -> bytes:
    """Image or audio file bytes within the media limits (an image's pixels checked before decoding)."""
    if len(data) > policy.max_bytes:
        raise _bad(f"{where}: {len(data)} bytes, over the media size limit ({policy.max_bytes})", where)
    if image_dimensions(data) is not None:
        policy.check_bytes(data, where)
    return data


def media_input(item: dict[str, Any], i: int, policy: MediaPolicy) -> str | MarkerPrompt | list[Any]:
    """An object input as an mtmd input: llama-server's ``{"prompt_string", "multimodal_data"}`` (a text
    alone when it has no media) or ``{"content": [parts]}`` (text, image_url and input_audio parts)."""
    where = f"input[{i}]"
    if "prompt_string" in item:
        text, data = item["prompt_string"], item.get("multimodal_data") or []
        if not isinstance(text, str):
            raise _bad(f"{where}.prompt_string must be a string", f"{where}.prompt_string")
        if not isinstance(data, list):
            raise _bad(f"{where}.multimodal_data must be a list of base64 strings", f"{where}.multimodal_data")
        if not data:
            return text
        media = [_media_bytes(_decode_b64(d, f"{where}.multimodal_data[{k}]"), policy,
                              f"{where}.multimodal_data[{k}]") for k, d in enumerate(data)]
        return MarkerPrompt(text, media)
    content = item.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise _bad(f"{where}: an object input needs 'prompt_string' (with 'multimodal_data') or 'content' (a list "
                   f"of text, image_url and input_audio parts); got keys {sorted(item)}", where)
    parts: list[Any] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url:
                raise _bad(f"{at}: an image_url part needs {{\"url\": ...}} (a data: URL)", at)
            parts.append(Image(policy.resolve(url, at)))
        elif kind == "input_audio":
            audio = part.get("input_audio")
            if not isinstance(audio, dict):
                raise _bad(f"{at}: an input_audio part needs {{\"data\": <base64>, \"format\": ...}}", at)
            parts.append(Audio(_media_bytes(_decode_b64(audio.get("data"), f"{at}.input_audio.data"), policy, at)))
        else:
            raise _bad(f"{at} has type {kind!r}: use text (with a string 'text'), image_url or input_audio", at)
    return parts


def _media_inputs(served: ServedModel, inputs: list[Any]) -> tuple[list[Any], bool]:
    """The inputs with each object as an mtmd input, and whether any holds media; a 400 where the
    model has no projector or a token-id input comes with media."""
    policy = MediaPolicy.with_dirs(served.settings.media_dirs)
    out: list[Any] = []
    media = False
    for i, item in enumerate(inputs):
        if isinstance(item, dict):
            item = media_input(item, i, policy)
            media = media or not isinstance(item, str)
        out.append(item)
    if not media:
        return out, False
    if served.media_embedder is None:
        raise APIError(400, f"input has image or audio data, but the model {served.alias!r} has no projector: serve "
                       "it with clip_model_path (an mmproj GGUF) next to embedding, or send text", code="invalid_model",
                       param="input")
    for i, item in enumerate(out):
        if not isinstance(item, (str, MarkerPrompt, list)) or (isinstance(item, list) and
                                                               all(isinstance(x, int) for x in item)):
            raise _bad(f"input[{i}]: token ids cannot be embedded with media in one request (the projector "
                       "tokenizes text itself): send it as text, or in a request of its own", f"input[{i}]")
    return out, True


def _embed_media(served: ServedModel, llama: Any, items: list[Any]) -> dict[str, Any]:
    """``{"rows", "usage"}`` of media inputs through the model's projector, pooled as its context pools
    (the engine's thread)."""
    pooling = llama.native_context().pooling_type()
    if pooling in (LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_RANK):
        kind = "none (one vector per token)" if pooling == LLAMA_POOLING_TYPE_NONE else "rank (a reranker)"
        raise APIError(400, f"the model {served.alias!r} pools by {kind}: inputs with media need a model with mean, "
                       "cls or last pooling", code="invalid_model", param="model")
    handler = served.media_embedder
    assert handler is not None
    total = 0
    for i, item in enumerate(items):
        where = f"input[{i}]"
        try:
            total += sum(p.chunk.n_tokens for p in handler.layout(item))
        except MultimodalError as exc:
            raise _bad(f"{where}: {exc}", where) from None
    try:
        rows = handler.embed(items, normalize=-1, pooling=pooling)
    except ContextOverflowError as exc:
        raise APIError(400, str(exc), code="context_length_exceeded", param="input") from None
    return {"rows": list(rows), "usage": {"prompt_tokens": total, "total_tokens": total}}


@router.post("/v1/embeddings", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def create_embedding(request: Request, body: CreateEmbeddingRequest) -> Any:
    served = await served_model(request, body.model)
    _embedding_model(served, "embeddings")
    inputs = _inputs(body.input)
    if not inputs:
        raise APIError(400, "input is empty: give a string, token ids, or a non-empty list of them", param="input")
    inputs, media = await asyncio.to_thread(_media_inputs, served, inputs)
    name = body.model or served.alias
    if media:
        group = await submit(request, served, 1, lambda _: (lambda llama: _embed_media(served, llama, inputs)))
    else:
        _check_pooling(served.llama, served.alias, False)
        lists = await asyncio.to_thread(_token_lists, served, inputs)
        group = await submit(request, served, 1, lambda _: _work(served, lists))
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
    _check_pooling(served.llama, served.alias, True)
    lists = await asyncio.to_thread(rank_token_lists, model, body.query, texts)
    await asyncio.to_thread(_token_lists, served, lists)  # each pair within the context
    group = await submit(request, served, 1, lambda _: _work(served, lists))
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
