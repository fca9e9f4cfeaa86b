"""Header checks added in the second reliability round, and ``kv_overrides`` applied to the header.

What a header alone decides is refused here, before any child process or native call: weight
tensors of a type ggml has no matmul for (integer types, ``Q8_1``, ``F64``), a
``general.alignment`` below ggml's tensor alignment, and the hyperparameters of
:func:`llama_cpp._safety.gguf_guard.check_hyperparameters` *after* ``kv_overrides`` replace the file's
values (an override bypassed the guard before). Everything else (token tables, tokenizer
kinds, architecture-specific sizes) is the isolated load's (:mod:`.isolated_load`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from .._errors import ModelLoadError
from . import gguf_guard as _gguf_guard

#: ggml types no backend multiplies a weight matrix in: Q8_1 (9), I8..I64 (24..27), F64 (28)
UNSUPPORTED_WEIGHT_TYPES = {9: "Q8_1", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
#: ggml's TENSOR_ALIGNMENT: the CPU backend asserts buffers are aligned to it
MIN_ALIGNMENT = 32
#: keys whose values must be even and within the head size
_ROPE_DIM = ".rope.dimension_count"


def check_header(path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None) -> None:
    """Read ``path``'s header, apply ``kv_overrides`` and refuse what llama.cpp would abort on."""
    name = os.fspath(path)
    header = _gguf_guard.read_header(name)
    meta = header.metadata
    for key, value in (kv_overrides or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"kv_overrides keys must be str, got {type(key).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ModelLoadError(f"{name}: kv_overrides[{key!r}] = {value!r} is not finite")
        meta[key] = value
    where = f"{name} (with kv_overrides)" if kv_overrides else name
    _gguf_guard.check_hyperparameters(header, where)
    align = meta.get("general.alignment")
    if align is not None and (not isinstance(align, int) or align < MIN_ALIGNMENT or align & (align - 1)):
        raise ModelLoadError(f"{where}: general.alignment = {align!r}; llama.cpp's CPU buffers need a power of "
                             f"two >= {MIN_ALIGNMENT} (rewrite the file with the default alignment, 32)")
    for t in header.tensors:
        if t.name.endswith(".weight") and len(t.shape) >= 2 and t.ggml_type in UNSUPPORTED_WEIGHT_TYPES:
            raise ModelLoadError(f"{where}: weight {t.name} is stored as {UNSUPPORTED_WEIGHT_TYPES[t.ggml_type]}, "
                                 "which ggml cannot multiply (re-convert the model to F32/F16/BF16 or a "
                                 "llama.cpp quantization such as Q8_0)")
    arch = meta.get("general.architecture")
    if isinstance(arch, str):
        _check_arch_sizes(meta, arch, where)


def _int(meta: Mapping[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _check_arch_sizes(meta: Mapping[str, Any], arch: str, where: str) -> None:
    p = arch + "."
    interval = _int(meta, p + "full_attention_interval")
    if interval is not None and interval < 1:
        raise ModelLoadError(f"{where}: {p}full_attention_interval = {interval}; accepted at least 1 "
                             "(llama.cpp divides by it)")
    rope = _int(meta, p + _ROPE_DIM[1:])
    if rope is None:
        return
    n_embd, n_head = _int(meta, p + "embedding_length"), _int(meta, p + "attention.head_count")
    head = _int(meta, p + "attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    if rope <= 0 or rope % 2 or (head is not None and rope > head):
        raise ModelLoadError(f"{where}: {p}rope.dimension_count = {rope}; accepted an even number in "
                             f"2..{head if head is not None else 'the head size'}")
    sections = meta.get(p + "rope.dimension_sections")
    if isinstance(sections, list) and (any(not isinstance(s, int) or s < 0 for s in sections)
                                       or sum(sections) * 2 > rope):
        raise ModelLoadError(f"{where}: {p}rope.dimension_sections = {sections}; each >= 0 and summing to at "
                             f"most rope.dimension_count / 2 ({rope // 2})")
