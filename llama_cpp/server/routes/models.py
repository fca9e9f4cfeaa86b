"""``/health`` (liveness without a key; the models' state with one) and ``/v1/models``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import APIError
from ..http import authenticate
from ..types import ModelData, ModelList
from .common import AUTH, guarded, registry, server_settings

router = APIRouter()


@router.get("/health", tags=["Extras"])
@guarded
async def health(request: Request) -> JSONResponse:
    reg = registry(request)
    lazy = server_settings(request).lazy_load
    ready = lazy or all(m.loaded for m in reg)
    body: dict[str, Any] = {"status": "ok" if ready else "loading"}
    try:
        await authenticate(request)
    except APIError:
        pass  # liveness needs no key; the models (aliases may be file paths) need it
    else:
        body["models"] = {m.alias: (m.engine.stats() if m.engine is not None else {"loaded": m.loaded})
                          for m in reg}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/v1/models", dependencies=AUTH, tags=["OpenAI V1"], response_model_exclude_none=True)
@guarded
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[ModelData(id=m.alias, speculative=m.speculative_info()) for m in registry(request)])


__all__ = ["health", "list_models", "router"]
