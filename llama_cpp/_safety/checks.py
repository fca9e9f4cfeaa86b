"""Checks on every value before it crosses into C: each error names the parameter and the
accepted range (``ParameterError``, a ``ValueError``). Run at construction and call entry, never
per generated token."""

from __future__ import annotations

import ctypes
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from .. import ggml_cpp as _ggml
from .. import llama_cpp as _llama
from .._errors import ParameterError
from ..llama_cpp import llama_model_params

log = logging.getLogger("llama_cpp")

#: ggml's GGML_MAX_N_THREADS: a threadpool larger than this aborts inside ggml.
MAX_THREADS = 512
#: a thread count above this multiple of the core count is refused (thread creation fails or crawls).
THREADS_PER_CORE_LIMIT = 4

def _enum(module: Any, prefix: str, names: tuple[str, ...] | None = None) -> dict[int, str]:
    """Value -> lower-case name of the generated bindings' ``PREFIX*`` constants (``MAX_VALUE`` is
    a bound, not a value); ``names`` picks a subset."""
    found = {getattr(module, n): n[len(prefix):].lower() for n in dir(module)
             if n.startswith(prefix) and not n.endswith("MAX_VALUE") and isinstance(getattr(module, n), int)}
    return {v: k for v, k in sorted(found.items()) if names is None or k in names}


#: the enum fields of llama.cpp's parameter structs and their accepted values, from the bindings
ENUMS: dict[str, Mapping[int, str]] = {
    "split_mode": _enum(_llama, "LLAMA_SPLIT_MODE_"),
    "load_mode": _enum(_llama, "LLAMA_LOAD_MODE_"),
    "rope_scaling_type": _enum(_llama, "LLAMA_ROPE_SCALING_TYPE_"),
    "pooling_type": _enum(_llama, "LLAMA_POOLING_TYPE_"),
    "attention_type": _enum(_llama, "LLAMA_ATTENTION_TYPE_"),
    "flash_attn_type": _enum(_llama, "LLAMA_FLASH_ATTN_TYPE_"),
    "mirostat_mode": {0: "off", 1: "mirostat", 2: "mirostat v2"},  # a Python-side choice, not a C enum
    # the ggml types llama.cpp's tools accept for the KV cache (common/arg.cpp kv_cache_types)
    "type_k": _enum(_ggml, "GGML_TYPE_", ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")),
}
ENUMS["type_v"] = ENUMS["type_k"]


def integer(name: str, value: Any) -> int:
    """``value`` as an int (bools and integral floats are not guessed at)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    return int(value.__index__())


def in_range(name: str, value: Any, lo: int, hi: int) -> int:
    v = integer(name, value)
    if not lo <= v <= hi:
        raise ParameterError(f"{name}={v} is out of range [{lo}, {hi}]")
    return v


def finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ParameterError(f"{name} must be finite, got {v}")
    return v


def enum(name: str, value: Any) -> int:
    v = integer(name, value)
    allowed = ENUMS[name]
    if v not in allowed:
        listed = ", ".join(f"{k} ({n})" for k, n in allowed.items())
        raise ParameterError(f"{name}={v} is not one of {listed}")
    return v


def _ctype_range(ctype: Any) -> tuple[int, int]:
    bits = 8 * ctypes.sizeof(ctype)
    if ctype(-1).value == -1:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1


def struct_field(struct: type[ctypes.Structure], name: str, value: Any) -> Any:
    """Check ``value`` for ``struct.name`` against the field's C type (and its enum, if it is one)."""
    if name in ENUMS:
        return enum(name, value)
    ctype = dict((f[0], f[1]) for f in struct._fields_).get(name)
    if ctype in (ctypes.c_float, ctypes.c_double):
        return finite(name, value)
    if ctype is not None and ctype is not ctypes.c_bool and issubclass(ctype, ctypes._SimpleCData) \
            and ctype._type_ in "bBhHiIlLqQ":
        lo, hi = _ctype_range(ctype)
        return in_range(name, value, lo, hi)
    return value


def threads(name: str, value: Any) -> int:
    """A thread count the machine can start: refused above ``4 x cores`` (or ggml's cap), a warning
    above the core count."""
    cores = os.cpu_count() or 1
    hi = min(MAX_THREADS, THREADS_PER_CORE_LIMIT * cores)
    v = in_range(name, value, 1, hi)
    if v > cores:
        log.warning("%s=%d is above this machine's %d cores: generation will be slow", name, v, cores)
    return v


def penalty_last_n(value: Any, n_ctx: int) -> int:
    """``-1`` means ``n_ctx`` (as upstream); otherwise ``0..n_ctx``."""
    v = integer("penalty_last_n", value)
    if v == -1:
        return n_ctx
    return in_range("penalty_last_n", v, -1, n_ctx)



def model_params(**params: Any) -> None:
    """Check ``llama_model_params`` fields given by keyword (None: llama.cpp's default)."""
    for name, value in params.items():
        if value is not None:
            struct_field(llama_model_params, name, value)


def context_sizes(*, n_ctx: Any, n_batch: Any, n_ubatch: Any) -> None:
    """The context sizes as uint32 (``n_ctx=0``: the model's own), the batch sizes at least 1."""
    in_range("n_ctx", n_ctx, 0, 2 ** 32 - 1)
    in_range("n_batch", n_batch, 1, 2 ** 32 - 1)
    in_range("n_ubatch", n_ubatch, 1, 2 ** 32 - 1)


def sampling(*, temperature: Any, top_k: Any, top_p: Any, min_p: Any, typical_p: Any, repeat_penalty: Any,
             frequency_penalty: Any, presence_penalty: Any, mirostat_mode: Any, mirostat_tau: Any,
             mirostat_eta: Any, seed: Any) -> None:
    """The sampler chain's parameters: finite floats, an int32 ``top_k``, a uint32 seed, a known mirostat mode."""
    for name, v in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p), ("typical_p", typical_p),
                    ("repeat_penalty", repeat_penalty), ("frequency_penalty", frequency_penalty),
                    ("presence_penalty", presence_penalty), ("mirostat_tau", mirostat_tau),
                    ("mirostat_eta", mirostat_eta)):
        finite(name, v)
    in_range("top_k", top_k, -(2 ** 31), 2 ** 31 - 1)
    in_range("seed", seed, 0, 2 ** 32 - 1)
    enum("mirostat_mode", mirostat_mode)
