"""The placement and fit arguments of ``Llama``/``LlamaEmbedding``, turned into what the model loads with."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .._core.model import flash_attn_type
from .fit import FitResult, check_fit_ctx, fit_margins, fit_params
from .placement import Placement, resolve

log = logging.getLogger(__name__)

#: the keywords this module reads (those a caller leaves out keep these values)
DEFAULTS: dict[str, Any] = {"devices": None, "cpu_moe": False, "n_cpu_moe": 0, "override_tensor": None,
                            "rpc_servers": None, "fit": False, "fit_target": None, "fit_ctx": None}

@dataclass
class Prepared:
    """The load's placement: the model keywords, and ``n_ctx`` (which ``fit=True`` may choose)."""

    placement: Placement
    n_gpu_layers: int
    tensor_split: list[float] | None
    n_ctx: int
    fit: FitResult | None = None

    def model_kwargs(self) -> dict[str, Any]:
        return {"n_gpu_layers": self.n_gpu_layers, "tensor_split": self.tensor_split, **self.placement.model_kwargs()}


def prepare(args: Mapping[str, Any]) -> Prepared:
    """Check and resolve ``devices``, ``cpu_moe``, ``n_cpu_moe``, ``override_tensor``, ``rpc_servers``
    (their devices are registered here) and, with ``fit=True``, fit to free memory leaving ``fit_target``
    MiB free per device and ``n_ctx`` (when 0) at least ``fit_ctx``; before loading."""
    a = {**DEFAULTS, **{k: v for k, v in args.items() if v is not None or k not in DEFAULTS}}
    placement = resolve(devices=a["devices"], cpu_moe=a["cpu_moe"], n_cpu_moe=a["n_cpu_moe"],
                        override_tensor=a["override_tensor"], rpc_servers=a["rpc_servers"])
    ngl, ts = int(a.get("n_gpu_layers", 0)), a.get("tensor_split")
    n_ctx = a.get("n_ctx")
    out = Prepared(placement, ngl, None if ts is None else list(ts), 0 if n_ctx is None else int(n_ctx))
    if not isinstance(a["fit"], bool):
        raise TypeError(f"fit must be a bool, not {type(a['fit']).__name__}")
    margins, n_ctx_min = fit_margins(a["fit_target"]), check_fit_ctx(a["fit_ctx"])
    if not a["fit"] and (a["fit_target"] is not None or a["fit_ctx"] is not None):
        raise ValueError("fit_target and fit_ctx are settings of the fit: pass fit=True with them")
    if not a["fit"]:
        if placement.rpc_devices and ngl == 0:
            log.warning("rpc_servers=%s: n_gpu_layers is 0, so no layer goes to the remote devices (set "
                        "n_gpu_layers, -1 for all, or fit=True)", a["rpc_servers"])
        return out
    fa = a.get("flash_attn", False)
    res = fit_params(
        a["model_path"], n_ctx=out.n_ctx, margins=margins, n_ctx_min=n_ctx_min, n_gpu_layers=None if ngl in (0, -1) else ngl,
        devices=placement.device_names, tensor_split=ts, override_tensor=placement.overrides or None,
        split_mode=a.get("split_mode"), main_gpu=a.get("main_gpu"), n_seq_max=a.get("n_seq_max"),
        kv_unified=a.get("kv_unified"), n_batch=a.get("n_batch"), n_ubatch=a.get("n_ubatch"),
        flash_attn_type=flash_attn_type(fa), type_k=a.get("type_k"), type_v=a.get("type_v"))
    if res.status != "success":
        log.warning("fit=True: no parameters were found that fit the free device memory; loading with the "
                    "closest the fit tried (%s)", res.cli_args())
    out.fit, out.n_gpu_layers, out.n_ctx = res, res.n_gpu_layers, res.n_ctx
    if res.tensor_split:
        out.tensor_split = list(res.tensor_split)
    if res.override_tensor and not placement.overrides:
        fitted = resolve(override_tensor=dict(res.override_tensor))  # the devices stay those resolved above
        out.placement = replace(placement, overrides=fitted.overrides, override_handles=fitted.override_handles)
    log.info("fit=True: %s", res.cli_args())
    return out
