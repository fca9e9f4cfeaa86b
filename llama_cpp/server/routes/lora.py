"""llama-server's ``GET/POST /lora-adapters``: a model's LoRA adapters and their global scales."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from ..errors import APIError
from .common import AUTH, guarded, served_model

router = APIRouter()


@router.get("/lora-adapters", dependencies=AUTH, tags=["Extras"])
@guarded
async def get_lora_adapters(request: Request, model: str | None = None) -> list[dict[str, Any]]:
    """``model``'s adapters (default: the first model) as ``[{id, path, scale, ...}]``."""
    served = await served_model(request, model)
    return served.lora.info() if served.lora is not None else []


@router.post("/lora-adapters", dependencies=AUTH, tags=["Extras"])
@guarded
async def set_lora_adapters(request: Request, model: str | None = None) -> dict[str, Any]:
    """Set ``model``'s global scales from ``[{"id": N, "scale": s}, ...]`` (unnamed adapters: 0)."""
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, list):
        raise APIError(400, "the request body must be an array of {\"id\": N, \"scale\": s} objects",
                       code="invalid_value")
    served = await served_model(request, model)
    if served.lora is None:
        if body:
            raise APIError(400, f"the model {served.alias!r} has no LoRA adapters (serve it with lora_adapters "
                           "or lora_path)", code="invalid_value")
        return {"success": True}
    served.lora.set_global(body)
    return {"success": True}


__all__ = ["get_lora_adapters", "router", "set_lora_adapters"]
