"""Configuration of speculative decoding: the n-gram parameter classes, :class:`SpecConfig` (its types
are rows of :mod:`llama_cpp.speculative.registry`, which also defines :class:`SpeculativeType`) and
:class:`MTPState`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import SpeculativeError
from .gguf_nextn import CHAINED_NEXTN_ARCHS, NEXTN_H_ALL_ROWS_ARCHS, NEXTN_H_OUTPUT_ROWS_ARCHS  # noqa: F401 (here too)
from .nextn import DRAFT_TOP_K, NEXTN_SYMBOLS  # noqa: F401 (here too)
from .registry import NEEDS_DRAFT_MODEL, NEEDS_NEXTN, SpeculativeType, find, rows_of, spec_of

log = logging.getLogger("llama_cpp.speculative")

#: The largest ``draft_n_max`` accepted (llama.cpp has no hard limit; beyond this the verify
#: batch costs more than a draft can plausibly win back).
DRAFT_N_MAX_LIMIT = 64

INHERITED_PARAMS = ("n_threads", "n_threads_batch", "flash_attn_type", "type_k", "type_v", "offload_kqv",
                     "op_offload", "kv_unified", "no_perf")


_NGRAM_SIZE_LIMIT = 1024  # llama.cpp's bound on --spec-ngram-* sizes


def _parse_type(value: Any, given: Any) -> SpeculativeType:
    if isinstance(value, SpeculativeType):
        return value
    key = str(value).strip()
    try:
        return SpeculativeType(key.lower().replace("_", "-"))
    except ValueError:
        try:
            return SpeculativeType[key.upper().replace("-", "_")]
        except KeyError:
            row = find(key.lower().replace("_", "-"))
            if row is not None:
                return row.type  # a type registered outside the enum
            names = ", ".join(t.value for t in SpeculativeType)
            raise SpeculativeError(f"unknown spec_type {given!r}: use one of {names}") from None


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
        raise SpeculativeError(f"{owner}{name} must be an int in {lo}..{hi}, got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class NgramMapParams:
    """``ngram-simple`` / ``ngram-map-k`` / ``ngram-map-k4v`` parameters (llama.cpp's names).

    ``size_n``: tokens of the n-gram looked up; ``size_m``: tokens drafted after a match;
    ``min_hits``: occurrences of the key before ``ngram-map-k4v`` drafts (unused by the others).
    """

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_n", _check_int("ngram ", "size_n", self.size_n, 1, _NGRAM_SIZE_LIMIT))
        object.__setattr__(self, "size_m", _check_int("ngram ", "size_m", self.size_m, 1, _NGRAM_SIZE_LIMIT))
        object.__setattr__(self, "min_hits", _check_int("ngram ", "min_hits", self.min_hits, 1, 65535))


@dataclasses.dataclass(frozen=True)
class NgramModParams:
    """``ngram-mod`` parameters: ``n_match`` tokens are hashed; drafts are ``n_min..n_max`` long."""

    n_match: int = 24
    n_max: int = 64
    n_min: int = 48

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_match", _check_int("ngram_mod ", "n_match", self.n_match, 1, _NGRAM_SIZE_LIMIT))
        object.__setattr__(self, "n_max", _check_int("ngram_mod ", "n_max", self.n_max, 0, _NGRAM_SIZE_LIMIT))
        object.__setattr__(self, "n_min", _check_int("ngram_mod ", "n_min", self.n_min, 0, _NGRAM_SIZE_LIMIT))
        if self.n_min > self.n_max:
            raise SpeculativeError(f"ngram_mod n_min={self.n_min} must not exceed n_max={self.n_max}")


@dataclasses.dataclass(frozen=True)
class NgramCacheParams:
    """``ngram-cache`` parameters: optional llama.cpp lookup-cache files and the draft length
    (llama.cpp fixes ``n_draft`` at 8)."""

    lookup_cache_static: str | os.PathLike[str] | None = None
    lookup_cache_dynamic: str | os.PathLike[str] | None = None
    n_draft: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_draft", _check_int("ngram_cache ", "n_draft", self.n_draft, 1, _NGRAM_SIZE_LIMIT))
        for name in ("lookup_cache_static", "lookup_cache_dynamic"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise SpeculativeError(f"ngram_cache {name} must be a path or None, got {v!r}")


@dataclasses.dataclass(frozen=True)
class PromptLookupParams:
    """``prompt-lookup`` parameters, as ``LlamaPromptLookupDecoding`` names them."""

    max_ngram_size: int = 2
    num_pred_tokens: int = 10

    def __post_init__(self) -> None:
        for name in ("max_ngram_size", "num_pred_tokens"):
            object.__setattr__(self, name, _check_int("prompt_lookup ", name, getattr(self, name), 1,
                                                      _NGRAM_SIZE_LIMIT))


def _params(value: Any, cls: type, name: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        try:
            return cls(**value)
        except TypeError as e:
            raise SpeculativeError(f"{name}: {e}") from None
    raise SpeculativeError(f"{name} must be a {cls.__name__} or a dict of its fields, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    - ``spec_type``: a :class:`SpeculativeType` (or its name/value, e.g. ``"draft-mtp"``), or
      several (a list, or names joined by commas as in ``--spec-type``): each step verifies the
      first non-empty draft in llama.cpp's priority order (n-gram types, then the draft-* type;
      at most one draft-* type per list, as llama.cpp has one draft context).
      ``None`` means ``draft-simple`` when ``draft_model_path`` is given, else ``draft-mtp``.
      :attr:`types` lists them all.
    - ``draft_n_max``: most tokens drafted per step by a draft model or MTP head, ``1..DRAFT_N_MAX_LIMIT``.
    - ``draft_n_min``: a draft shorter than this is dropped (the step verifies only the last token).
    - ``draft_p_min``: stop drafting when the draft's top token has less than this probability
      (its share of the draft's top 10 candidates, as llama.cpp computes it); 0 never stops early.
    - ``n_rs_seq``: recurrent-state snapshots of the target for rollback without a checkpoint;
      ``None`` means ``draft_n_max`` with MTP and 0 otherwise (llama.cpp's defaults: a verify
      writes one snapshot per position, which for the long n-gram drafts costs more than one
      sequence checkpoint). Drafts longer than this take a checkpoint before the verify and
      restore it on rejection (hybrid/recurrent targets only; attention-only targets always
      remove a rejected suffix directly).
    - ``draft_model_path`` / ``draft_n_gpu_layers``: the ``draft-simple`` model, the
      ``draft-eagle3``, ``draft-dflash`` or ``draft-dspark`` draft (one draft file per configuration).
    - ``ngram_simple``, ``ngram_map_k``, ``ngram_map_k4v`` (:class:`NgramMapParams`),
      ``ngram_mod`` (:class:`NgramModParams`), ``ngram_cache`` (:class:`NgramCacheParams`):
      the n-gram types' parameters, as llama.cpp's ``common_params_speculative`` names them;
      ``prompt_lookup`` (:class:`PromptLookupParams`): those of ``prompt-lookup``, upstream's
      ``LlamaPromptLookupDecoding`` (``Llama(draft_model=LlamaPromptLookupDecoding(...))`` adds
      that type with the object's own lookup).
    """

    spec_type: Any = None
    draft_n_max: int = 3
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    n_rs_seq: int | None = None
    draft_model_path: str | os.PathLike[str] | None = None
    draft_n_gpu_layers: int = 0
    ngram_simple: NgramMapParams = dataclasses.field(default_factory=NgramMapParams)
    ngram_map_k: NgramMapParams = dataclasses.field(default_factory=NgramMapParams)
    ngram_map_k4v: NgramMapParams = dataclasses.field(default_factory=NgramMapParams)
    ngram_mod: NgramModParams = dataclasses.field(default_factory=NgramModParams)
    ngram_cache: NgramCacheParams = dataclasses.field(default_factory=NgramCacheParams)
    prompt_lookup: PromptLookupParams = dataclasses.field(default_factory=PromptLookupParams)
    types: tuple[SpeculativeType, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        given = self.spec_type
        if self.types and (given is None or _parse_type(given, given) is _parse_type(self.types[0], self.types)):
            given = list(self.types)  # types=[...] given (or carried over by dataclasses.replace)
        if given is None:
            raw: list[Any] = [SpeculativeType.DRAFT_SIMPLE if self.draft_model_path is not None
                              else SpeculativeType.DRAFT_MTP]
        elif isinstance(given, str) and not isinstance(given, SpeculativeType):
            raw = [part for part in given.split(",") if part.strip()] or [given]
        elif isinstance(given, (list, tuple)):
            raw = list(given)
            if not raw:
                raise SpeculativeError("spec_type is an empty list: give at least one type (or 'none')")
        else:
            raw = [given]
        types: list[SpeculativeType] = []
        for item in raw:
            t = _parse_type(item, given)
            if t not in types:
                types.append(t)
        if SpeculativeType.NONE in types:
            types = [SpeculativeType.NONE]
        object.__setattr__(self, "spec_type", types[0])
        object.__setattr__(self, "types", tuple(types))
        st = types[0]
        for name in ("draft_n_max", "draft_n_min", "draft_n_gpu_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise SpeculativeError(f"{name} must be an int, got {v!r}")
            object.__setattr__(self, name, int(v))
        if st is not SpeculativeType.NONE and not 1 <= self.draft_n_max <= DRAFT_N_MAX_LIMIT:
            raise SpeculativeError(
                f"draft_n_max={self.draft_n_max} is out of range: use 1..{DRAFT_N_MAX_LIMIT} tokens per draft")
        if not 0 <= self.draft_n_min <= self.draft_n_max:
            raise SpeculativeError(
                f"draft_n_min={self.draft_n_min} must be between 0 and draft_n_max={self.draft_n_max}")
        p = self.draft_p_min
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0.0 <= float(p) <= 1.0:
            raise SpeculativeError(f"draft_p_min must be a probability in [0, 1], got {p!r}")
        object.__setattr__(self, "draft_p_min", float(p))
        if self.n_rs_seq is not None:
            r = self.n_rs_seq
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= int(r) <= DRAFT_N_MAX_LIMIT:
                raise SpeculativeError(f"n_rs_seq must be None or an int in 0..{DRAFT_N_MAX_LIMIT}, got {r!r}")
            object.__setattr__(self, "n_rs_seq", int(r))
        for name in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
            object.__setattr__(self, name, _params(getattr(self, name), NgramMapParams, name))
        object.__setattr__(self, "ngram_mod", _params(self.ngram_mod, NgramModParams, "ngram_mod"))
        object.__setattr__(self, "ngram_cache", _params(self.ngram_cache, NgramCacheParams, "ngram_cache"))
        object.__setattr__(self, "prompt_lookup", _params(self.prompt_lookup, PromptLookupParams, "prompt_lookup"))
        dm = self.draft_model_path
        if dm is not None and not isinstance(dm, (str, os.PathLike)):
            raise SpeculativeError(f"draft_model_path must be a path, got {dm!r}")
        # llama.cpp gives every draft-* type of a list the same single draft context (one draft
        # file, or the MTP context over the target): two of them cannot run together there
        drafts = [r.name for r in rows_of(self) if r.needs]
        if len(drafts) > 1:
            raise SpeculativeError(
                f"{' and '.join(drafts)} cannot be combined: llama.cpp runs every draft-* type of a list on its one "
                "draft context (the draft_model_path model, or the MTP head's context), so a list holds at most one "
                "of them; combine it with the n-gram types instead")
        for r in rows_of(self):
            if NEEDS_DRAFT_MODEL in r.needs and dm is None:
                raise SpeculativeError(f"spec_type {r.name!r} needs a draft model: give "
                                       "SpecConfig(draft_model_path='draft.gguf')")

    @property
    def enabled(self) -> bool:
        return self.spec_type is not SpeculativeType.NONE

    @property
    def needs_nextn(self) -> bool:
        """Whether the target model's NextN (MTP) tensors must be loaded."""
        return any(NEEDS_NEXTN in r.needs for r in rows_of(self))

    @property
    def n_max(self) -> int:
        """The longest draft any of :attr:`types` can propose (llama.cpp's ``common_speculative_n_max``)."""
        return max((spec_of(t).longest(self) for t in self.types if t is not SpeculativeType.NONE), default=0)

    @property
    def rollback_snapshots(self) -> int:
        """``n_rs_seq`` for the target context."""
        if self.n_rs_seq is not None:
            return self.n_rs_seq
        if self.needs_nextn:
            return self.draft_n_max
        return 0  # llama.cpp's need_n_rs_seq(): checkpoints, not per-position snapshots of long drafts


@dataclasses.dataclass(frozen=True)
class MTPState:
    """A snapshot of an :class:`MTPDecoder` (both contexts' sequence state and the pending token)."""

    target: bytes
    draft: bytes
    kv_tokens: tuple[int, ...]
    id_last: int | None
    pending_h: bytes
    n_draft_past: int
    #: chained heads whose layers hold the history (a decoder fills those its drafts can reach:
    #: ``min(draft_n_max, heads)``); 0: every head
    heads: int = 0




Sampler = Any  # a LlamaSampler, or a callable (target_context, batch_index) -> token


# the package's path, as before the split (reprs, pickles): llama_cpp.speculative re-exports them
for _cls in (SpeculativeType, NgramMapParams, NgramModParams, NgramCacheParams, PromptLookupParams, SpecConfig, MTPState):
    _cls.__module__ = "llama_cpp.speculative"
