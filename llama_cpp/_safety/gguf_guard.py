"""Read a GGUF header (metadata and tensor table) with bounds, and refuse values llama.cpp asserts on.

llama.cpp answers many malformed hyperparameters with ``GGML_ASSERT``, which aborts the whole
interpreter; this reader runs first, stdlib only, and raises :class:`ModelLoadError` naming the key
and the accepted range. Counts and lengths are checked against the bytes left before anything is
allocated, so a hostile header costs at most one pass over the file's header.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from .._core.gguf import (
    ARRAY,
    GGML_MAX_DIMS,
    GGML_TYPE_COUNT,
    GGML_TYPE_F32,
    LLAMA_MAX_EXPERTS,
    LLAMA_MAX_LAYERS,
    MAX_STRING,
    STRING,
    open_header,
)
from .._errors import ModelLoadError

_EPSILON_SUFFIXES = (".attention.layer_norm_epsilon", ".attention.layer_norm_rms_epsilon", ".norm_epsilon")


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int


@dataclass
class GGUFHeader:
    """Scalar metadata (arrays are kept only when numeric and short) and the tensor table."""

    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse the header, metadata and tensor table of ``path``; raises ModelLoadError if malformed."""
    with open_header(path) as (r, n_tensors, n_kv):
        header = GGUFHeader(version=struct.unpack_from("<I", r.buf, 4)[0])
        for _ in range(n_kv):
            key = r.string("a metadata key")
            header.metadata[key] = r.value(r.take("<I"), key)
        for _ in range(n_tensors):
            tname = r.string("a tensor name")
            n_dims = r.take("<I")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise r.fail(f"tensor {tname} has {n_dims} dimensions; accepted 1..{GGML_MAX_DIMS}")
            shape = tuple(r.take("<Q") for _ in range(n_dims))
            if any(d == 0 or d >= 1 << 62 for d in shape) or math.prod(shape) >= 1 << 62:
                raise r.fail(f"tensor {tname} has shape {shape}; every dimension must be in 1..2**62")
            ttype = r.take("<I")
            if ttype >= GGML_TYPE_COUNT:
                raise r.fail(f"tensor {tname} has type {ttype}; accepted 0..{GGML_TYPE_COUNT - 1}")
            r.take("<Q")  # data offset: llama.cpp checks it against the file size itself
            header.tensors.append(TensorInfo(tname, shape, ttype))
    return header


def _refuse(path: str, key: str, value: Any, accepted: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: {key} = {value!r} is outside what llama.cpp accepts ({accepted})")


def _scalar(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_hyperparameters(header: GGUFHeader, path: str) -> None:
    """Refuse the header values that reach a ``GGML_ASSERT`` or a division by zero in llama.cpp."""
    meta = header.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return  # llama.cpp refuses a missing architecture with an error of its own
    p = f"{arch}."
    n_layer = _scalar(meta, p + "block_count")
    if n_layer is not None and not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise _refuse(path, p + "block_count", n_layer, f"1..{LLAMA_MAX_LAYERS}")
    nextn = _scalar(meta, p + "nextn_predict_layers")
    if nextn is not None and n_layer is not None and nextn > n_layer:
        raise _refuse(path, p + "nextn_predict_layers", nextn, f"0..block_count ({n_layer})")
    n_expert = _scalar(meta, p + "expert_count") or 0
    if n_expert > LLAMA_MAX_EXPERTS:
        raise _refuse(path, p + "expert_count", n_expert, f"0..{LLAMA_MAX_EXPERTS}")
    used = meta.get(p + "expert_used_count")
    used_max = max(used) if isinstance(used, list) and used else used if isinstance(used, int) else 0
    if not 0 <= used_max <= n_expert or (n_expert > 0 and used_max == 0):
        raise _refuse(path, p + "expert_used_count", used, f"1..expert_count ({n_expert})" if n_expert
                      else "0 without experts")
    groups = _scalar(meta, p + "expert_group_count") or 0
    if n_expert > 0 and (groups >= n_expert or (groups > 1 and n_expert % groups)):
        raise _refuse(path, p + "expert_group_count", groups, f"below and dividing expert_count ({n_expert})")
    _check_heads(meta, p, path, has_attention=any(t.name.endswith("attn_q.weight") for t in header.tensors))
    for key, value in meta.items():
        if key.startswith(p) and key.endswith(_EPSILON_SUFFIXES) and isinstance(value, float) and not (
                math.isfinite(value) and value > 0):
            raise _refuse(path, key, value, "a finite value > 0")
    for t in header.tensors:
        if "ssm_conv1d" in t.name and t.name.endswith(".weight") and t.ggml_type != GGML_TYPE_F32:
            raise ModelLoadError(f"{path}: tensor {t.name} has ggml type {t.ggml_type}; ggml's ssm_conv "
                                 "accepts only F32 (0): re-convert the model without quantizing it")


def _check_heads(meta: dict[str, Any], p: str, path: str, *, has_attention: bool) -> None:
    n_embd = _scalar(meta, p + "embedding_length")
    n_head = _scalar(meta, p + "attention.head_count")
    n_head_kv = _scalar(meta, p + "attention.head_count_kv")
    if n_head == 0 and has_attention:
        raise _refuse(path, p + "attention.head_count", 0, "at least 1 in a model with attention tensors")
    if not n_head:  # 0 or per-layer: recurrent and hybrid models have attention-free layers
        return
    if n_embd is not None and p + "attention.key_length" not in meta and n_embd % n_head:
        raise _refuse(path, p + "attention.head_count", n_head, f"a divisor of embedding_length ({n_embd})")
    if n_head_kv is not None and (n_head_kv == 0 or n_head % n_head_kv):
        raise _refuse(path, p + "attention.head_count_kv", n_head_kv, f"a divisor of head_count ({n_head})")


def guard_model_file(path: str | os.PathLike[str]) -> None:
    """Read ``path``'s header and refuse it before llama.cpp does something worse than fail."""
    check_hyperparameters(read_header(path), os.fspath(path))


@dataclass
class VocabHeader:
    """A file's ``tokenizer.ggml.*`` metadata as stored (None: the key is absent).

    ``tokens`` are the raw token texts (llama.cpp's ``llama_vocab_get_text``: an empty one reads
    ``[EMPTY_<id>]``); ``n_vocab_key`` is ``<arch>.vocab_size`` (what a ``no_vocab`` model has).
    """

    model: str | None = None
    pre: str | None = None
    tokens: list[bytes] | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    n_vocab_key: int | None = None


_VOCAB_KEYS = {"tokenizer.ggml.model": "model", "tokenizer.ggml.pre": "pre", "tokenizer.ggml.bos_token_id": "bos_id",
               "tokenizer.ggml.eos_token_id": "eos_id", "tokenizer.ggml.add_bos_token": "add_bos",
               "tokenizer.ggml.add_eos_token": "add_eos"}


def read_vocab(path: str | os.PathLike[str]) -> VocabHeader:
    """The tokenizer metadata of ``path`` (token texts included), read from its header without llama.cpp;
    raises ModelLoadError if the header is malformed."""
    out = VocabHeader()
    arch: str | None = None
    sizes: dict[str, int] = {}
    with open_header(path) as (r, _n_tensors, n_kv):
        buf = r.buf
        for _ in range(n_kv):
            key = r.string("a metadata key")
            vtype = r.take("<I")
            if key == "tokenizer.ggml.tokens" and vtype == ARRAY:
                etype = r.take("<I")
                if etype != STRING:
                    raise r.fail(f"tokenizer.ggml.tokens has element type {etype}; llama.cpp reads strings")
                n = r.count("array length of tokenizer.ggml.tokens", 1 << 40, 8)
                tokens: list[bytes] = []
                for i in range(n):
                    size = r.count("length of a token", MAX_STRING, 1)
                    text = bytes(buf[r.pos:r.pos + size])
                    r.pos += size
                    tokens.append(text or f"[EMPTY_{i}]".encode())
                out.tokens = tokens
                continue
            value = r.value(vtype, key)
            field_name = _VOCAB_KEYS.get(key)
            if field_name is not None:
                setattr(out, field_name, value)
            elif key == "general.architecture" and isinstance(value, str):
                arch = value
            elif key.endswith(".vocab_size") and isinstance(value, int):
                sizes[key] = value
    if arch is not None:
        out.n_vocab_key = sizes.get(f"{arch}.vocab_size")
    return out
