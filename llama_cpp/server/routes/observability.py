"""llama-server's operator endpoints: ``/metrics`` (Prometheus text), ``/slots`` and ``/props``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse

from ..._version import __version__
from .. import metrics
from ..types import CreateChatCompletionRequest
from .common import AUTH, engine_of, guarded, registry, served_model

router = APIRouter()

# the sampling defaults a chat request gets, as /props' default_generation_settings.params
_PARAMS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
           "frequency_penalty", "mirostat_mode", "mirostat_tau", "mirostat_eta", "seed")


@router.get("/metrics", dependencies=AUTH, tags=["Extras"])
@guarded
async def get_metrics(request: Request) -> PlainTextResponse:
    models = [(m.alias, m.engine) for m in registry(request) if m.engine is not None]
    return PlainTextResponse(metrics.render(models, request.app.state.keys),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/slots", dependencies=AUTH, tags=["Extras"])
@guarded
async def get_slots(request: Request, model: str | None = None) -> list[dict[str, Any]]:
    """The slots of ``model`` (default: the first model)."""
    served = await served_model(request, model)
    slots = engine_of(served).slots()
    speculates = bool(served.spec_types())
    for s in slots:
        s["speculative"] = speculates
    return slots


@router.get("/props", dependencies=AUTH, tags=["Extras"])
@guarded
async def get_props(request: Request, model: str | None = None) -> dict[str, Any]:
    """``model``'s properties (default: the first model), in llama-server's shape."""
    served = await served_model(request, model)
    llama = served.llama
    m = llama.native_model()
    defaults = CreateChatCompletionRequest.model_fields
    params = {k: defaults[k].default for k in _PARAMS}
    engine = served.engine
    bos, eos = m.token_bos(), m.token_eos()
    props: dict[str, Any] = {
        "default_generation_settings": {"params": params, "n_ctx": served.n_ctx_slot},
        "total_slots": 0 if engine is None else (1 if engine.serial else engine.n_slots),
        "model_alias": served.alias, "model_path": served.settings.model,
        "modalities": {"vision": bool(served.settings.clip_model_path), "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": True, "endpoint_metrics": True,
        "chat_template": m.chat_template() or "",
        "bos_token": m.token_text(bos) if bos >= 0 else "", "eos_token": m.token_text(eos) if eos >= 0 else "",
        "build_info": f"llama-cpp-python {__version__}", "is_sleeping": False,
    }
    tool_use = m.chat_template("tool_use")
    if tool_use:
        props["chat_template_tool_use"] = tool_use
    return props


__all__ = ["get_metrics", "get_props", "get_slots", "router"]
