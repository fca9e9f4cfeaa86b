"""Checks of the model files and context parameters a configuration needs, made before loading
(NextN layers read from GGUF metadata, draft headers), and loading of an MTP model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._core.model import LlamaModel
from .._errors import ModelLoadError, SpeculativeError
from .._safety.gguf_guard import read_header
from .config import SpecConfig, SpeculativeType
from .draft import check_vocab_files, overrides_tokenizer
from .gguf_nextn import gguf_nextn_layers
from .nextn import check_mtp_loaded, check_nextn_heads  # noqa: F401 (here too)
from .registry import NEEDS_DRAFT_MODEL, find, rows_of, table


def check_model_file(path: str | os.PathLike[str], config: SpecConfig,
                     kv_overrides: Mapping[str, Any] | None = None) -> None:
    """Check what ``config`` needs from files before anything loads: NextN layers in the target
    for MTP, the draft model and n-gram cache files present. ``kv_overrides`` are those the target
    will be loaded with (they take the place of the header's values)."""
    if not config.enabled:
        return
    check_context_params(config, {})  # names an unimplemented type as such
    if config.needs_nextn:
        n = gguf_nextn_layers(path, kv_overrides)
        if n == 0:
            raise SpeculativeError(
                f"{os.fspath(path)} has no NextN (MTP) layers (<arch>.nextn_predict_layers is 0 or absent): "
                "MTP speculative decoding needs a model converted with its MTP head; use "
                "SpecConfig(spec_type='none') or another model")
        if n is not None and n > 1:
            check_nextn_heads(_gguf_arch(path), n, os.fspath(path))
    if SpeculativeType.DRAFT_SIMPLE in config.types:
        dm = os.fspath(config.draft_model_path)  # type: ignore[arg-type]
        if not os.path.isfile(dm):
            raise SpeculativeError(f"draft_model_path {dm!r} is not a file: give the path of a GGUF draft model")
        arch = _gguf_arch(dm)
        if arch in ("eagle3", "dflash"):
            kind = "draft-eagle3" if arch == "eagle3" else "draft-dflash' (or 'draft-dspark' with a Markov head)"
            raise SpeculativeError(f"{dm} is a draft of architecture {arch!r}, not a separate draft model: use "
                                   f"spec_type='{kind}'")
    for row in rows_of(config):
        if row.check_draft is None:
            continue
        meta = _gguf_meta(path)
        arch = meta.get("general.architecture")
        n_layer = meta.get(f"{arch}.block_count")
        n_layer = n_layer - int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0) if isinstance(n_layer, int) else None
        n_embd = meta.get(f"{arch}.embedding_length")
        row.check_draft(config.draft_model_path, target_arch=arch,
                        target_n_embd=n_embd if isinstance(n_embd, int) else None, target_n_layer=n_layer)

    if any(NEEDS_DRAFT_MODEL in r.needs for r in rows_of(config)) and not overrides_tokenizer(kv_overrides):
        # llama.cpp's vocabulary rule on both headers (a draft it would refuse loads nothing)
        check_vocab_files(path, config.draft_model_path)  # type: ignore[arg-type]
    if SpeculativeType.NGRAM_CACHE in config.types:
        for name in ("lookup_cache_static", "lookup_cache_dynamic"):
            v = getattr(config.ngram_cache, name)
            if v is not None and not os.path.isfile(v):
                raise SpeculativeError(f"ngram_cache {name} {os.fspath(v)!r} is not a file")


def _gguf_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A GGUF file's metadata (empty if unreadable: llama.cpp's load reports that itself)."""

    try:
        return read_header(path).metadata
    except (OSError, ModelLoadError):
        return {}


def _gguf_arch(path: str | os.PathLike[str]) -> str | None:
    arch = _gguf_meta(path).get("general.architecture")
    return arch if isinstance(arch, str) else None


def check_before_load(path: str | os.PathLike[str], config: SpecConfig | None, kv_overrides: Mapping[str, Any] | None,
                      ctx_params: Mapping[str, Any], load_mtp: bool) -> bool:
    """Everything about a model file and its context sizes checkable before loading, for ``config``
    (None: no speculation) and ``load_mtp`` (a caller that drafts with the NextN heads itself, the
    server's slots); True when the NextN tensors are to be loaded."""
    spec_on = config is not None and config.enabled
    if spec_on:
        check_model_file(path, config, kv_overrides)
        check_context_params(config, ctx_params)
    want_mtp = (spec_on and config.needs_nextn) or load_mtp
    if want_mtp and not spec_on:
        check_model_file(path, SpecConfig(spec_type=SpeculativeType.DRAFT_MTP), kv_overrides)
    return want_mtp


def check_context_params(config: SpecConfig, ctx_params: Mapping[str, Any]) -> None:
    """Reject types not implemented and context sizes that cannot hold one verify batch, before
    any native call."""
    if not config.enabled:
        return
    missing = [t.value for t in config.types if find(t.value) is None]
    if missing:
        done = ", ".join(r.name for r in table())
        raise SpeculativeError(f"speculative type {', '.join(missing)} is not implemented yet: use one of {done} "
                               "or 'none'")
    if any(r.needs for r in rows_of(config)):  # a draft model or the NextN heads: one verify of draft_n_max
        need = config.draft_n_max + 1
        for name in ("n_batch", "n_ubatch"):
            v = ctx_params.get(name)
            if v is not None and 0 < int(v) < need:
                raise SpeculativeError(
                    f"{name}={int(v)} cannot hold one verify batch of draft_n_max + 1 = {need} tokens: raise "
                    f"{name} to at least {need} or lower draft_n_max")
    else:
        need = 2  # n-gram drafts are cut to what one micro-batch holds
    n_ctx = ctx_params.get("n_ctx")
    if n_ctx is not None and 0 < int(n_ctx) < need + 1:
        raise SpeculativeError(
            f"n_ctx={int(n_ctx)} is too small for speculative decoding with draft_n_max={config.draft_n_max}: "
            f"it needs at least {need + 1} positions")
    n_seq = ctx_params.get("n_seq_max")
    if n_seq is not None and int(n_seq) != 1:
        raise SpeculativeError(f"speculative decoding runs one sequence: n_seq_max must be 1, got {n_seq}")
    if ctx_params.get("embeddings"):
        raise SpeculativeError("speculative decoding needs a generation context: embeddings must be off")


def target_context_params(config: SpecConfig, ctx_params: Mapping[str, Any]) -> dict[str, Any]:
    """``ctx_params`` for the target context of ``config`` (``n_rs_seq`` sized for rollback)."""
    check_context_params(config, ctx_params)
    out = dict(ctx_params)
    if config.enabled:
        out["n_rs_seq"] = config.rollback_snapshots
        out.pop("ctx_type", None)
    return out


def load_mtp_model(path: str | os.PathLike[str], **model_kwargs: Any) -> Any:
    """Load ``path`` as a :class:`~llama_cpp._internals.LlamaModel` with its NextN layers.

    The file's metadata is checked first (no NextN layers: :class:`SpeculativeError`, nothing
    loaded). ``model_kwargs`` go to ``LlamaModel`` (``n_gpu_layers``, ``use_mmap``, ...).
    """

    check_model_file(path, SpecConfig(spec_type=SpeculativeType.DRAFT_MTP))
    model_kwargs.pop("load_mtp", None)
    return LlamaModel(path, load_mtp=True, **model_kwargs)
