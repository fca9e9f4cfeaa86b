"""llama.cpp's fit to free memory (``common_fit_params`` in common/fit.cpp, behind ``--fit`` and
``llama-fit-params``) through ``llama_cpp_ext_fit_params`` in libllama-cpp-ext.

The fit loads the model and a context without allocating (``no_alloc``), measures what each device
would hold, then lowers the layers on the devices, moves MoE experts to the CPU and shortens the
context until every device keeps its margin free. Only what llama.cpp would fit is changed: layers
and splits left at llama.cpp's defaults, no tensor overrides given, and ``n_ctx=0``.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._chat import native_chat
from .._errors import LibraryLoadError, ModelLoadError
from .devices import all_devices, buffer_types

MiB = 1024 * 1024
#: common_params::fit_params_target and fit_params_min_ctx
DEFAULT_MARGIN = 1024 * MiB
DEFAULT_N_CTX_MIN = 4096

_fn: Any = None
_fn_lock = threading.Lock()
# the per-layer expert pattern the fit writes for layers whose experts stay on the CPU (fit.cpp)
_LAYER_MOE = re.compile(r"^blk\\\.(\d+)\\\.ffn_\(up\|down\|gate_up\|gate\)_\(ch\|\)exps$")


def fit_margins(fit_target: int | str | Sequence[int] | None) -> list[int]:
    """llama.cpp's ``-fitt``/``--fit-target``: the memory to leave free on each device, in MiB (one value
    for every device, or one per device in order; a string as the option takes, "1024" or "512,2048")
    -> bytes. None: llama.cpp's default (1024 MiB)."""
    if fit_target is None:
        return [DEFAULT_MARGIN]
    if isinstance(fit_target, str):
        parts = [p.strip() for p in re.split(r"[,/]+", fit_target.strip())]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"fit_target must be MiB per device, e.g. '1024' or '512,2048', got {fit_target!r}")
        values: list[Any] = [int(p) for p in parts]
    elif isinstance(fit_target, int):
        values = [fit_target]
    elif isinstance(fit_target, Sequence):
        values = list(fit_target)
    else:
        raise TypeError(f"fit_target must be MiB (an int), one per device (a list) or a string such as '512,2048', "
                        f"not {type(fit_target).__name__}")
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"fit_target must be MiB >= 0 per device (llama.cpp's -fitt), got {fit_target!r}")
    return [v * MiB for v in values]


def check_fit_ctx(value: Any) -> int:
    """llama.cpp's ``-fitc``/``--fit-ctx``: the smallest ``n_ctx`` the fit may choose (None: 4096)."""
    if value is None:
        return DEFAULT_N_CTX_MIN
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fit_ctx must be an int >= 0 (the smallest n_ctx the fit may choose, llama.cpp's -fitc), "
                         f"got {value!r}")
    return value


@dataclass(frozen=True)
class FitResult:
    """What the fit chose: the values ``llama-fit-params`` prints as ``-c``, ``-ngl``, ``-ts``, ``-ot``."""

    status: str  # "success", or "failure" (no allocation found that fits: the values are the closest tried)
    n_ctx: int
    n_gpu_layers: int
    tensor_split: tuple[float, ...] = ()  # empty for one device
    override_tensor: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (pattern, buffer type)

    @property
    def n_cpu_moe(self) -> int:
        """Layers whose MoE experts the fit keeps on the CPU (its per-layer expert overrides)."""
        return sum(1 for p, b in self.override_tensor if b == "CPU" and _LAYER_MOE.match(p))

    def cli_args(self) -> str:
        """The arguments as ``llama-fit-params`` prints them."""
        out = f"-c {self.n_ctx} -ngl {self.n_gpu_layers}"
        if self.tensor_split:
            out += " -ts " + ",".join(str(int(x)) for x in self.tensor_split)
        if self.override_tensor:
            out += ' -ot "' + ",".join(f"{p}={b}" for p, b in self.override_tensor) + '"'
        return out


FitResult.__module__ = "llama_cpp"  # the public name (llama_cpp.FitResult), for reprs and pickles


def _function() -> Any:
    global _fn
    with _fn_lock:
        if _fn is None:
            lib = native_chat.load_library()
            try:
                f = lib.cdll.llama_cpp_ext_fit_params
            except AttributeError:
                raise LibraryLoadError(f"{lib.path} has no llama_cpp_ext_fit_params: a libllama-cpp-ext built "
                                       "before the fit was added; reinstall or rebuild the native libraries") from None
            f.argtypes, f.restype = [ctypes.c_char_p], ctypes.c_void_p
            _fn = (f, lib)
        return _fn


def _device_handles(names: Sequence[str]) -> list[int]:
    """Device names -> handles (an RPC server's devices are outside ggml's registry, see .rpc)."""
    by_name = {d.name: d.handle for d in all_devices()}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"fit_params: unknown device: {', '.join(unknown)}; devices: {', '.join(by_name)}")
    return [by_name[n] for n in names]


def _buft_handles(overrides: Sequence[tuple[str, str]]) -> list[list[Any]]:
    bufts = buffer_types()
    unknown = [b for _p, b in overrides if b not in bufts]
    if unknown:
        raise ValueError(f"fit_params: unknown buffer type: {', '.join(unknown)}; available: {', '.join(bufts)}")
    return [[p, bufts[b]] for p, b in overrides]


def fit_params(model_path: str | os.PathLike[str], *, n_ctx: int = 0, n_ctx_min: int = DEFAULT_N_CTX_MIN,
               margins: int | Sequence[int] = DEFAULT_MARGIN, n_gpu_layers: int | None = None,
               devices: Sequence[str] | None = None, tensor_split: Sequence[float] | None = None,
               override_tensor: Sequence[tuple[str, str]] | None = None, split_mode: int | None = None,
               main_gpu: int | None = None, n_seq_max: int | None = None, kv_unified: bool | None = None,
               n_batch: int | None = None, n_ubatch: int | None = None, flash_attn_type: int | None = None,
               type_k: int | None = None, type_v: int | None = None, verbose: bool = False) -> FitResult:
    """Fit ``n_gpu_layers``, the tensor split, MoE expert placement and ``n_ctx`` (when 0) to the
    devices' free memory, leaving ``margins`` bytes free on each (one value: every device), as
    ``llama-fit-params -fitt MiB -fitc n_ctx_min`` does. ``None`` leaves llama.cpp's default.

    Raises :class:`ModelLoadError` when llama.cpp cannot load the model to measure it, ValueError
    for an unknown device or buffer type.
    """
    path = os.fspath(model_path)
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    margin_list = [int(margins)] if isinstance(margins, int) else [int(m) for m in margins]
    if not margin_list or any(m < 0 for m in margin_list):
        raise ValueError(f"margins must be bytes >= 0 (one value, or one per device), got {margins!r}")
    req: dict[str, Any] = {"model_path": path, "n_ctx": int(n_ctx), "n_ctx_min": int(n_ctx_min),
                           "margins": margin_list, "verbose": bool(verbose)}
    optional = {"n_gpu_layers": n_gpu_layers, "devices": None if devices is None else _device_handles(devices),
                "tensor_split": None if tensor_split is None else [float(x) for x in tensor_split],
                "tensor_buft_overrides": _buft_handles(override_tensor) if override_tensor else None,
                "split_mode": split_mode, "main_gpu": main_gpu, "n_seq_max": n_seq_max, "kv_unified": kv_unified,
                "n_batch": n_batch, "n_ubatch": n_ubatch, "flash_attn_type": flash_attn_type,
                "type_k": type_k, "type_v": type_v}
    req.update({k: v for k, v in optional.items() if v is not None})
    f, lib = _function()
    from .._native import log_routing as _logging

    with _logging.router().capture_problems() as problems:
        doc = lib.take_json(f(json.dumps(req).encode("utf-8")))
    if "error" in doc:
        kind = doc.get("kind")
        raise (ValueError if kind == "invalid_argument" else ModelLoadError)(f"fit_params: {doc['error']}")
    if doc["status"] == "error":
        reason = "; ".join(problems[-4:]) or "see the llama_cpp.native log"
        raise ModelLoadError(f"fit_params could not load {path} to measure it: {reason}")
    return FitResult(status=doc["status"], n_ctx=int(doc["n_ctx"]), n_gpu_layers=int(doc["n_gpu_layers"]),
                     tensor_split=tuple(float(x) for x in doc["tensor_split"]),
                     override_tensor=tuple((p, b) for p, b in doc["tensor_buft_overrides"]))
