"""Speculative decoding: configuration, statistics and the decoders, one per kind of draft.

Types (llama.cpp's ``common_speculative_type`` names, :class:`SpeculativeType`):

- ``draft-mtp``: :class:`MTPDecoder` below, the model's own NextN head(s). With several heads
  (step35, hy-v3, mimo2: the architectures whose MTP graph takes ``llama_set_nextn_layer_offset``
  and allows more than one block) they are chained as llama.cpp chains them: draft step ``i``
  runs head ``i``, so a draft is at most as long as there are heads (``draft_n_max`` is capped,
  as in llama.cpp). gemma4-style heads sharing the target's memory belong to a separate
  assistant model and are not served here.
- ``draft-simple`` (a separate draft model, :mod:`llama_cpp.speculative.draft`), ``draft-eagle3`` (an
  EAGLE3 draft head fed with target hidden states, :mod:`llama_cpp.speculative.eagle3`), ``draft-dflash``
  (a DFlash block-diffusion draft over target hidden states, :mod:`llama_cpp.speculative.dflash`, with
  DFlash2's selector lattice when the draft has one), ``draft-dspark`` (DFlash with a Markov
  head, the same module) and the n-gram types ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``,
  ``ngram-mod``, ``ngram-cache`` (:mod:`llama_cpp.speculative.ngram`): drafters verified by
  :class:`~llama_cpp.speculative.engine.DraftDecoder`.
- ``prompt-lookup`` (this package's name, not llama.cpp's): upstream llama-cpp-python's
  ``LlamaPromptLookupDecoding`` as an n-gram drafter of the same engine, asked before the other
  types (as the server's slots ask it). It drafts after the *earliest* earlier occurrence of the
  longest matching n-gram (``max_ngram_size`` down to 1); ``ngram-simple`` after the *latest*
  occurrence of exactly ``size_n`` tokens. ``Llama(draft_model=LlamaPromptLookupDecoding(...))``
  adds it, drafting with that very object.
- Several types at once (``SpecConfig(spec_type=[...])``, llama.cpp's ``--spec-type a,b``):
  each step verifies the first non-empty draft in llama.cpp's priority order (prompt-lookup, ngram-simple,
  ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, draft-simple, draft-eagle3, draft-mtp,
  draft-dflash, draft-dspark), whatever the order given. llama.cpp creates one draft context for
  the whole list (over the ``-md`` file, typed ``LLAMA_CONTEXT_TYPE_MTP`` when draft-mtp is listed,
  or the MTP context over the target) and hands it to every draft-* type, so a list holds any
  n-gram types and at most one draft-* type: two are refused here (in llama.cpp they fail).

:func:`make_decoder` picks the decoder for a configuration; ``Llama(speculative=...)`` uses it.

:class:`MTPDecoder` drafts tokens with a model's own NextN head(s) and verifies them with the
trunk in one batch, the way llama.cpp's ``common_speculative_impl_draft_mtp`` and
``examples/speculative-simple`` do:

- a *target* context (the trunk; ``n_rs_seq`` recurrent-state snapshots so hybrid/recurrent
  layers can roll back a rejected suffix) and a *draft* context of type
  ``LLAMA_CONTEXT_TYPE_MTP`` over the same model (``n_ctx`` equal to the target's);
- the target returns the hidden state ``h_p`` of every position (the staging API
  ``llama_get_embeddings_nextn``); the draft context is fed pairs ``(x_p, h_{p-1})`` in an
  extended batch (:class:`~llama_cpp.LlamaBatchExt`, token + hidden-state rows), so its KV
  cache stays one step behind the target and it can propose ``x_{p+1}, x_{p+2}, ...``;
- one step: draft ``d_0..d_{k-1}`` from ``(id_last, h_{n_past-1})``, verify
  ``[id_last, d_0..d_{k-1}]`` on the target as one atomic decode with every row an output,
  accept the longest prefix the target sampler agrees with plus one target token, remove the
  rejected positions from both contexts (``llama_memory_seq_rm``), and catch the draft context
  up on the accepted tokens;
- when the target memory cannot remove that many positions (recurrent state with fewer
  snapshots than the rejected suffix, ``n_rs_seq`` smaller than the draft), a sequence-state
  checkpoint taken before the verify is restored and the accepted tokens are replayed.

Acceptance rule (sampling with temperature): *sample and match*, as llama.cpp's server and
``speculative-simple`` do. Every emitted token is drawn by the caller's target sampler chain from
the target's logits at its position, exactly as in plain decoding; a draft token only decides
whether the next position's logits (computed in the same verify batch) are valid, i.e. it is
accepted iff it equals the token the target sampler drew. The output therefore has exactly the
target's distribution, and with a seeded sampler it is the same token sequence as plain
decoding (one random draw per emitted token in both). Greedy decoding is the special case where
the sampler is argmax.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .._errors import ContextOverflowError, OptionalSymbolMissing, SpeculativeError
from ..llama_cpp import LLAMA_CONTEXT_TYPE_MTP, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import GreedyRows, RawExtBatch, SeqCheckpoint, check_snapshot_ubatch, common_prefix, greedy_chain
from .engine import (
    GREEDY_ROWS_MIN_VOCAB,
    DraftDecoder,
    DraftState,
    checked_prompt,
    close_drafters,
    propose,
    share_threadpools,
    tell_drafters,
    verify_draft,
    warm_up,
)
from .stats import SpeculativeStats

log = logging.getLogger("llama_cpp.speculative")

#: The largest ``draft_n_max`` accepted (llama.cpp has no hard limit; beyond this the verify
#: batch costs more than a draft can plausibly win back).
DRAFT_N_MAX_LIMIT = 64

_NEXTN_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")
_INHERITED_PARAMS = ("n_threads", "n_threads_batch", "flash_attn_type", "type_k", "type_v", "offload_kqv",
                     "op_offload", "kv_unified", "no_perf")
_DRAFT_TOP_K = 10  # the draft's confidence is its top token's share of the top 10, as in llama.cpp
#: Architectures whose MTP graph runs any of several NextN blocks (``il = n_layer +
#: nextn_layer_offset``) without asserting a single one; every other MTP graph of the pinned
#: llama.cpp aborts the process when a model declares more than one.
CHAINED_NEXTN_ARCHS = frozenset(("step35", "hy-v3", "mimo2"))
#: MTP graphs (the pinned llama.cpp's ``src/models``) whose NextN hidden state covers every entry of
#: a batch (taken before the output rows are selected). llama.cpp's masked mode copies the first
#: ``n_outputs`` rows of it, which are the output's only when the output comes first: their draft
#: contexts return every entry's row (unmasked) and are read by batch index.
NEXTN_H_ALL_ROWS_ARCHS = frozenset(("qwen35", "qwen35moe", "hy-v3"))
#: MTP graphs whose NextN hidden state holds the output rows only (masked mode returns the output's).
NEXTN_H_OUTPUT_ROWS_ARCHS = frozenset(("step35", "mimo2"))


class SpeculativeType(str, enum.Enum):
    """Kinds of speculative decoding (values are llama.cpp's ``--spec-type`` names)."""

    NONE = "none"
    DRAFT_SIMPLE = "draft-simple"    # a separate, smaller draft model sharing the vocabulary
    DRAFT_EAGLE3 = "draft-eagle3"    # an EAGLE3 draft head over target hidden states
    DRAFT_MTP = "draft-mtp"          # the model's own NextN (MTP) head(s)
    DRAFT_DFLASH = "draft-dflash"    # a DFlash block-diffusion draft over target hidden states
    DRAFT_DSPARK = "draft-dspark"    # DFlash with a Markov head
    NGRAM_SIMPLE = "ngram-simple"    # the continuation of the latest earlier n-gram match
    NGRAM_MAP_K = "ngram-map-k"      # n-gram keys in a hash map, draft length from past acceptance
    NGRAM_MAP_K4V = "ngram-map-k4v"  # n-gram keys with up to four counted m-gram continuations
    NGRAM_MOD = "ngram-mod"          # a hash table from n-grams to the next token, chained
    NGRAM_CACHE = "ngram-cache"      # 1..4-gram continuation counts (+ static/dynamic cache files)
    #: upstream llama-cpp-python's LlamaPromptLookupDecoding (not a llama.cpp type): the continuation
    #: of the earliest earlier match of the longest n-gram (``max_ngram_size`` down to 1)
    PROMPT_LOOKUP = "prompt-lookup"


#: llama.cpp's priority (upstream's prompt lookup first, as the server's slots ask it): the first
#: type that drafts something in a step is verified.
_PRIORITY = (SpeculativeType.PROMPT_LOOKUP,
             SpeculativeType.NGRAM_SIMPLE, SpeculativeType.NGRAM_MAP_K, SpeculativeType.NGRAM_MAP_K4V,
             SpeculativeType.NGRAM_MOD, SpeculativeType.NGRAM_CACHE, SpeculativeType.DRAFT_SIMPLE,
             SpeculativeType.DRAFT_EAGLE3, SpeculativeType.DRAFT_MTP, SpeculativeType.DRAFT_DFLASH,
             SpeculativeType.DRAFT_DSPARK)
_NGRAM_TYPES = frozenset(_PRIORITY[:6])
_NOT_IMPLEMENTED: frozenset[SpeculativeType] = frozenset()
_DRAFT_MODEL_TYPES = frozenset((SpeculativeType.DRAFT_SIMPLE, SpeculativeType.DRAFT_EAGLE3,
                                SpeculativeType.DRAFT_DFLASH, SpeculativeType.DRAFT_DSPARK))
# drafts fed target hidden states
_FEATURE_TYPES = (SpeculativeType.DRAFT_EAGLE3, SpeculativeType.DRAFT_DFLASH, SpeculativeType.DRAFT_DSPARK)
_IMPLEMENTED = tuple(t for t in SpeculativeType if t not in _NOT_IMPLEMENTED)
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
        drafts = [t.value for t in _PRIORITY if t in types and t not in _NGRAM_TYPES]
        if len(drafts) > 1:
            raise SpeculativeError(
                f"{' and '.join(drafts)} cannot be combined: llama.cpp runs every draft-* type of a list on its one "
                "draft context (the draft_model_path model, or the MTP head's context), so a list holds at most one "
                "of them; combine it with the n-gram types instead")
        for t in _DRAFT_MODEL_TYPES:
            if t in types and dm is None:
                raise SpeculativeError(f"spec_type {t.value!r} needs a draft model: give "
                                       "SpecConfig(draft_model_path='draft.gguf')")

    @property
    def enabled(self) -> bool:
        return self.spec_type is not SpeculativeType.NONE

    @property
    def needs_nextn(self) -> bool:
        """Whether the target model's NextN (MTP) tensors must be loaded."""
        return SpeculativeType.DRAFT_MTP in self.types

    @property
    def n_max(self) -> int:
        """The longest draft any of :attr:`types` can propose (llama.cpp's ``common_speculative_n_max``)."""
        n = 0
        for t in self.types:
            if t in (SpeculativeType.NGRAM_SIMPLE, SpeculativeType.NGRAM_MAP_K, SpeculativeType.NGRAM_MAP_K4V):
                n = max(n, getattr(self, t.name.lower()).size_m)
            elif t is SpeculativeType.NGRAM_MOD:
                n = max(n, self.ngram_mod.n_max)
            elif t is SpeculativeType.NGRAM_CACHE:
                n = max(n, self.ngram_cache.n_draft)
            elif t is SpeculativeType.PROMPT_LOOKUP:
                n = max(n, self.prompt_lookup.num_pred_tokens)
            elif t is not SpeculativeType.NONE:
                n = max(n, self.draft_n_max)
        return n

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


# --------------------------------------------------------------------------------------------
# GGUF metadata: does a file have NextN layers? (read without loading the model)
# --------------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_nextn_layers(path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None) -> int | None:
    """``<arch>.nextn_predict_layers`` from a GGUF file's header (0 when absent, None if unreadable),
    or from ``kv_overrides`` (those the model will be loaded with) where they set it.

    Reads only the key/value section, so asking for MTP on a model without NextN layers fails
    before llama.cpp loads any weights.
    """
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                return _scan_gguf(buf, kv_overrides or {})
            finally:
                buf.release()
    except (OSError, ValueError, struct.error, IndexError):
        return None


def _scan_gguf(buf: memoryview, kv_overrides: Mapping[str, Any]) -> int | None:
    if bytes(buf[:4]) != b"GGUF":
        return None
    version, = struct.unpack_from("<I", buf, 4)
    if version < 2:
        return None
    n_kv, = struct.unpack_from("<Q", buf, 16)
    off = 24
    arch: str | None = None
    values: dict[str, int] = {}

    def read_str(o: int) -> tuple[str, int]:
        n, = struct.unpack_from("<Q", buf, o)
        return bytes(buf[o + 8:o + 8 + n]).decode("utf-8", "replace"), o + 8 + n

    def skip(t: int, o: int) -> tuple[Any, int]:
        if t in _GGUF_SCALARS:
            fmt = "<" + _GGUF_SCALARS[t]
            return struct.unpack_from(fmt, buf, o)[0], o + struct.calcsize(fmt)
        if t == 8:
            return read_str(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            if et in _GGUF_SCALARS:
                return None, o + n * struct.calcsize("<" + _GGUF_SCALARS[et])
            for _ in range(n):
                _, o = skip(et, o)
            return None, o
        raise ValueError(f"unknown GGUF value type {t}")

    for _ in range(n_kv):
        key, off = read_str(off)
        t, = struct.unpack_from("<I", buf, off)
        val, off = skip(t, off + 4)
        if key == "general.architecture":
            arch = val
        elif key.endswith(".nextn_predict_layers") and isinstance(val, int):
            values[key] = int(val)
    if arch is None:
        return None
    key = f"{arch}.nextn_predict_layers"
    override = kv_overrides.get(key)
    if isinstance(override, int) and not isinstance(override, bool):
        return override
    return values.get(key, 0)


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
            _check_nextn_heads(_gguf_arch(path), n, os.fspath(path))
    if SpeculativeType.DRAFT_SIMPLE in config.types:
        dm = os.fspath(config.draft_model_path)  # type: ignore[arg-type]
        if not os.path.isfile(dm):
            raise SpeculativeError(f"draft_model_path {dm!r} is not a file: give the path of a GGUF draft model")
        arch = _gguf_arch(dm)
        if arch in ("eagle3", "dflash"):
            kind = "draft-eagle3" if arch == "eagle3" else "draft-dflash' (or 'draft-dspark' with a Markov head)"
            raise SpeculativeError(f"{dm} is a draft of architecture {arch!r}, not a separate draft model: use "
                                   f"spec_type='{kind}'")
    for t in _FEATURE_TYPES:
        if t not in config.types:
            continue
        if t is SpeculativeType.DRAFT_EAGLE3:
            from .eagle3 import check_draft_header
        else:
            from functools import partial

            from .dflash import check_draft_header as check_dflash

            check_draft_header = partial(check_dflash, dspark=t is SpeculativeType.DRAFT_DSPARK)  # type: ignore[assignment]
        meta = _gguf_meta(path)
        arch = meta.get("general.architecture")
        n_layer = meta.get(f"{arch}.block_count")
        n_layer = n_layer - int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0) if isinstance(n_layer, int) else None
        n_embd = meta.get(f"{arch}.embedding_length")
        check_draft_header(config.draft_model_path, target_arch=arch,  # type: ignore[arg-type]
                           target_n_embd=n_embd if isinstance(n_embd, int) else None, target_n_layer=n_layer)
    from .draft import check_vocab_files, overrides_tokenizer

    if any(t in config.types for t in _DRAFT_MODEL_TYPES) and not overrides_tokenizer(kv_overrides):
        # llama.cpp's vocabulary rule on both headers (a draft it would refuse loads nothing)
        check_vocab_files(path, config.draft_model_path)  # type: ignore[arg-type]
    if SpeculativeType.NGRAM_CACHE in config.types:
        for name in ("lookup_cache_static", "lookup_cache_dynamic"):
            v = getattr(config.ngram_cache, name)
            if v is not None and not os.path.isfile(v):
                raise SpeculativeError(f"ngram_cache {name} {os.fspath(v)!r} is not a file")


def _gguf_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A GGUF file's metadata (empty if unreadable: llama.cpp's load reports that itself)."""
    from .._errors import ModelLoadError
    from .._safety.gguf_guard import read_header

    try:
        return read_header(path).metadata
    except (OSError, ModelLoadError):
        return {}


def _gguf_arch(path: str | os.PathLike[str]) -> str | None:
    arch = _gguf_meta(path).get("general.architecture")
    return arch if isinstance(arch, str) else None


def check_context_params(config: SpecConfig, ctx_params: Mapping[str, Any]) -> None:
    """Reject types not implemented and context sizes that cannot hold one verify batch, before
    any native call."""
    if not config.enabled:
        return
    missing = [t.value for t in config.types if t in _NOT_IMPLEMENTED]
    if missing:
        done = ", ".join(t.value for t in _IMPLEMENTED if t is not SpeculativeType.NONE)
        raise SpeculativeError(f"speculative type {', '.join(missing)} is not implemented yet: use one of {done} "
                               "or 'none'")
    if config.needs_nextn or any(t in config.types for t in _DRAFT_MODEL_TYPES):
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
    from .._internals import LlamaModel

    check_model_file(path, SpecConfig(spec_type=SpeculativeType.DRAFT_MTP))
    model_kwargs.pop("load_mtp", None)
    return LlamaModel(path, load_mtp=True, **model_kwargs)


def _check_nextn_heads(arch: str | None, n: int, what: str) -> None:
    """Several NextN heads only where llama.cpp's MTP graph can run each of them."""
    if n > 1 and arch not in CHAINED_NEXTN_ARCHS:
        raise SpeculativeError(
            f"{what} declares {n} NextN (MTP) layers, but llama.cpp's {arch!r} MTP graph runs exactly one "
            f"(it would abort the process): several heads are chained only for "
            f"{', '.join(sorted(CHAINED_NEXTN_ARCHS))}; convert the model with one MTP layer or use "
            "another speculative type")


def _check_mtp_loaded(model: Any) -> None:
    if getattr(model, "load_mtp", None) is not True:
        raise SpeculativeError(
            "this model was not loaded with its NextN (MTP) layers: load it with "
            "llama_cpp.speculative.load_mtp_model(path) (LlamaModel(path, load_mtp=True)), or use "
            "Llama(path, speculative=SpecConfig(...)) which does so")
    if model.n_layer_nextn() <= 0:
        raise SpeculativeError(
            "this model has no NextN (MTP) layers (llama_model_n_layer_nextn == 0): MTP speculative "
            "decoding needs a model converted with its MTP head; use SpecConfig(spec_type='none')")


# --------------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------------

Sampler = Any  # a LlamaSampler, or a callable (target_context, batch_index) -> token


def with_prompt_lookup(config: SpecConfig | None, lookup: Any) -> SpecConfig:
    """``config`` (None: no other type) plus ``prompt-lookup`` with the parameters of ``lookup``
    (a ``LlamaPromptLookupDecoding``); pass ``lookup`` itself to :func:`make_decoder` to draft with it."""
    params = PromptLookupParams(lookup.max_ngram_size, lookup.num_pred_tokens)
    if config is None or not config.enabled:
        return SpecConfig(SpeculativeType.PROMPT_LOOKUP, prompt_lookup=params)
    types = [SpeculativeType.PROMPT_LOOKUP, *(t for t in config.types if t is not SpeculativeType.PROMPT_LOOKUP)]
    return dataclasses.replace(config, spec_type=types, types=(), prompt_lookup=params)


def prompt_lookup_drafter(params: PromptLookupParams, fn: Any = None) -> Any:
    """The ``prompt-lookup`` drafter: ``fn`` (a ``LlamaPromptLookupDecoding`` or its call signature),
    by default upstream's lookup with ``params``, cut to ``params.num_pred_tokens`` tokens."""
    from .ngram import PromptLookup

    if fn is None:
        from ..llama_speculative import LlamaPromptLookupDecoding

        fn = LlamaPromptLookupDecoding(params.max_ngram_size, params.num_pred_tokens)
    return PromptLookup(fn, params.num_pred_tokens)


def build_drafters(model: Any, config: SpecConfig, target: Any, prompt_lookup: Any = None) -> list[Any]:
    """The token drafters of ``config``'s n-gram and draft-model types, in llama.cpp's priority order.

    ``prompt_lookup``: the callable that drafts for ``prompt-lookup`` (by default a
    ``LlamaPromptLookupDecoding`` with ``config.prompt_lookup``)."""
    from .draft import DraftModel
    from .ngram import NgramCache, NgramMap, NgramMod, NgramSimple, load_ngram_cache

    tp = getattr(target, "params", None)
    # draft contexts run like their target (threads above all)
    inherited = {n: getattr(tp, n) for n in _INHERITED_PARAMS if tp is not None and hasattr(tp, n)}
    out: list[Any] = []
    try:
        for t in _PRIORITY:
            if t not in config.types:
                continue
            if t is SpeculativeType.PROMPT_LOOKUP:
                out.append(prompt_lookup_drafter(config.prompt_lookup, prompt_lookup))
            elif t is SpeculativeType.NGRAM_SIMPLE:
                p = config.ngram_simple
                out.append(NgramSimple(p.size_n, p.size_m))
            elif t in (SpeculativeType.NGRAM_MAP_K, SpeculativeType.NGRAM_MAP_K4V):
                p = config.ngram_map_k if t is SpeculativeType.NGRAM_MAP_K else config.ngram_map_k4v
                out.append(NgramMap(p.size_n, p.size_m, p.min_hits, key_only=t is SpeculativeType.NGRAM_MAP_K))
            elif t is SpeculativeType.NGRAM_MOD:
                q = config.ngram_mod
                out.append(NgramMod(q.n_match, q.n_max, q.n_min))
            elif t is SpeculativeType.NGRAM_CACHE:
                c = config.ngram_cache
                static = load_ngram_cache(c.lookup_cache_static) if c.lookup_cache_static is not None else None
                dynamic = load_ngram_cache(c.lookup_cache_dynamic) if c.lookup_cache_dynamic is not None else None
                out.append(NgramCache(c.n_draft, static=static, dynamic=dynamic))
            elif t is SpeculativeType.DRAFT_SIMPLE:
                out.append(DraftModel(model, target, config.draft_model_path,  # type: ignore[arg-type]
                                      n_max=config.draft_n_max, n_min=config.draft_n_min,
                                      p_min=config.draft_p_min, ctx_params=inherited,
                                      n_gpu_layers=config.draft_n_gpu_layers))
            elif t in _FEATURE_TYPES:
                from .dflash import DFlashDrafter
                from .eagle3 import Eagle3Drafter

                kw = {} if t is SpeculativeType.DRAFT_EAGLE3 else {"dspark": t is SpeculativeType.DRAFT_DSPARK}
                cls = Eagle3Drafter if t is SpeculativeType.DRAFT_EAGLE3 else DFlashDrafter
                out.append(cls(model, target, config.draft_model_path,  # type: ignore[arg-type]
                               n_max=config.draft_n_max, n_min=config.draft_n_min, p_min=config.draft_p_min,
                               ctx_params=inherited, n_gpu_layers=config.draft_n_gpu_layers, **kw))
        for d in out:
            ctx = getattr(d, "ctx", None)
            if ctx is not None:
                share_threadpools(target, ctx)
    except BaseException:
        close_drafters(out)
        raise
    return out


def make_decoder(model: Any, config: SpecConfig, *, target: Any = None,
                 ctx_params: Mapping[str, Any] | None = None, prompt_lookup: Any = None) -> MTPDecoder | DraftDecoder:
    """The decoder that serves ``config``: :class:`MTPDecoder` when it includes ``draft-mtp``,
    else a :class:`~llama_cpp.speculative.engine.DraftDecoder` over the configured drafters.

    ``Llama`` passes its context as ``target``; without one, a target context is created from
    ``ctx_params`` (sized with :func:`target_context_params`) and owned by the decoder.
    ``prompt_lookup``: the object ``prompt-lookup`` drafts with (see :func:`build_drafters`).
    """
    if not isinstance(config, SpecConfig):
        raise SpeculativeError(f"config must be a SpecConfig, got {type(config).__name__}")
    if not config.enabled:
        raise SpeculativeError("spec_type 'none' needs no decoder")
    if config.needs_nextn:
        return MTPDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup)
    target, drafters, owns = draft_decoder_parts(model, config, target=target, ctx_params=ctx_params,
                                                 prompt_lookup=prompt_lookup)
    try:
        return DraftDecoder(model, target, config, drafters, owns_target=owns)
    except BaseException:
        if owns:
            target.close()
        raise


def draft_decoder_parts(model: Any, config: SpecConfig, *, target: Any = None,
                        ctx_params: Mapping[str, Any] | None = None, prompt_lookup: Any = None,
                        wrap: Callable[[list[Any], Any], list[Any]] | None = None) -> tuple[Any, list[Any], bool]:
    """What a :class:`~llama_cpp.speculative.engine.DraftDecoder` is built from: the target context
    (``target``, or one created from ``ctx_params``), the configured drafters (passed through
    ``wrap(drafters, target)`` when given) and whether the context was created here. A context
    created here is closed if anything after it fails."""
    from .._internals import LlamaContext

    params = dict(ctx_params or {})
    if target is not None:
        params.setdefault("n_ctx", target.n_ctx())
        params.setdefault("n_batch", target.n_batch())
        params.setdefault("n_ubatch", target.n_ubatch())
        params.setdefault("n_seq_max", target.n_seq_max())
    check_context_params(config, params)
    owns = target is None
    if owns:
        target = LlamaContext(model, **target_context_params(config, params))
    try:
        check_snapshot_ubatch(model, target, "the target context")
        drafters = build_drafters(model, config, target, prompt_lookup)
        return target, (wrap(drafters, target) if wrap is not None else drafters), owns
    except BaseException:
        if owns:
            target.close()
        raise


class MTPDecoder:
    """Greedy-exact MTP speculative decoding over one sequence of one model.

    ``MTPDecoder(model, ctx_params, config)`` creates the target context (``ctx_params`` are
    ``llama_context_params`` fields, as for :class:`~llama_cpp._internals.LlamaContext`) and the
    MTP draft context; pass ``target=`` to adopt a target context created with
    :func:`target_context_params`. Then :meth:`prefill` the token history (the last token is
    kept pending: it opens the first verify batch) and iterate :meth:`generate`.

    A model with several NextN heads (:data:`CHAINED_NEXTN_ARCHS`) has them chained as in
    llama.cpp: draft step ``i`` runs head ``i`` over the whole draft so far, the draft context's
    catch-up runs once per head a draft can reach (llama.cpp's runs it for every head; a head
    beyond ``draft_n_max`` never drafts, and its layer attends only to its own KV), and
    :attr:`draft_n_max` is ``config.draft_n_max`` capped at :attr:`n_heads`. The catch-up pairs
    wait for the next draft and are decoded in its first batch.
    """

    def __init__(self, model: Any, ctx_params: Mapping[str, Any] | None, config: SpecConfig, *,
                 target: Any = None, prompt_lookup: Any = None) -> None:
        from .._internals import LlamaContext
        from ..llama_batch import LlamaBatchExt

        self._target = self._draft = None
        self._extra: list[Any] = []
        if not isinstance(config, SpecConfig):
            raise SpeculativeError(f"config must be a SpecConfig, got {type(config).__name__}")
        if not config.needs_nextn:
            check_context_params(config, {})  # names an unimplemented type as such
            raise SpeculativeError(f"MTPDecoder runs spec_type 'draft-mtp', got {config.spec_type.value!r}")
        params = dict(ctx_params or {})
        if target is not None:
            params.setdefault("n_ctx", target.n_ctx())
            params.setdefault("n_batch", target.n_batch())
            params.setdefault("n_ubatch", target.n_ubatch())
            params.setdefault("n_seq_max", target.n_seq_max())
            # the draft context runs like its target (threads above all: oversubscribed threads
            # spin and make every decode orders of magnitude slower)
            tp = getattr(target, "params", None)
            for name in _INHERITED_PARAMS:
                if tp is not None and hasattr(tp, name):
                    params.setdefault(name, getattr(tp, name))
        check_context_params(config, params)
        self.config = config
        self.model = model
        _check_mtp_loaded(model)
        n_nextn = model.n_layer_nextn()
        C = model._C
        missing = [n for n in _NEXTN_SYMBOLS if not C.__bindings__.functions[n].available()]
        if missing:
            raise OptionalSymbolMissing(
                f"this llama.cpp build does not export {', '.join(missing)} (the MTP staging API): use a "
                "build from the pinned source")
        self._C = C
        # llama.cpp's modes: one head; several heads chained (draft step i runs head i); heads
        # sharing the target's memory (a separate gemma4-assistant model: refused below)
        self.n_heads = max(1, int(n_nextn))
        self._chain = self.n_heads > 1
        if self._chain:
            _check_nextn_heads(model.metadata.get("general.architecture"), self.n_heads, "this model")
            if not C.__bindings__.functions["llama_set_nextn_layer_offset"].available():
                raise OptionalSymbolMissing(
                    "this llama.cpp build does not export llama_set_nextn_layer_offset, which chaining "
                    f"{self.n_heads} NextN heads needs: use a build from the pinned source")
        #: the longest MTP draft: ``config.draft_n_max``, capped at the number of chained heads
        self.draft_n_max = min(config.draft_n_max, self.n_heads) if self._chain else config.draft_n_max
        # the heads a draft can reach: only their layers need the history's pairs
        self._n_used = min(self.n_heads, self.draft_n_max) if self._chain else 1
        if self.draft_n_max < config.draft_n_max:
            log.info("draft_n_max=%d capped at the model's %d chained NextN heads (as llama.cpp does)",
                     config.draft_n_max, self.n_heads)

        owns_target = target is None
        if owns_target:
            target = LlamaContext(model, **target_context_params(config, params))
        elif target.n_seq_max() != 1:
            raise SpeculativeError("the target context must have n_seq_max=1")
        self._owns_target = owns_target
        self._target = target
        try:
            check_snapshot_ubatch(model, target, "the MTP target context")
            dparams = {k: v for k, v in params.items() if k not in ("n_rs_seq", "ctx_type", "n_ctx")}
            # the draft outputs one row per decode (as in llama.cpp's tools): a one-row output
            # buffer instead of n_batch rows
            dparams.update(ctx_type=LLAMA_CONTEXT_TYPE_MTP, n_ctx=target.n_ctx(), n_rs_seq=0,
                           n_batch=target.n_batch(), n_ubatch=target.n_ubatch(), n_seq_max=1,
                           n_outputs_max=1, n_outputs_max_per_seq=1)
            self._draft = LlamaContext(model, ctx_other=target, **dparams)
            if self._mem_shared():
                raise SpeculativeError(
                    "this MTP draft context shares the target's memory (gemma4-assistant style heads run in "
                    "one graph): that mode is not implemented here; use a model with its own NextN layers")
            share_threadpools(target, self._draft)
            C.llama_set_embeddings_nextn(target.ptr, True, False)   # h for every verified position
            # h of every entry where the graph computes it for all (read by batch index), else of the
            # output only; elsewhere a batch's last row is not known to be right: no batch that needs it
            arch = model.metadata.get("general.architecture")
            unmasked = arch in NEXTN_H_ALL_ROWS_ARCHS
            self._h_last_exact = unmasked or arch in NEXTN_H_OUTPUT_ROWS_ARCHS
            C.llama_set_embeddings_nextn(self._draft.ptr, True, not unmasked)
            self._tbatch = LlamaBatchExt(target)
            self._dbatch = LlamaBatchExt(self._draft)
            n_embd = int(model.n_embd_out())
            self._traw = RawExtBatch(self._tbatch, target, n_embd)
            self._ckpt = SeqCheckpoint(target, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            self._draw = RawExtBatch(self._dbatch, self._draft, n_embd)
            # the other types of a combined configuration, asked before the MTP head (llama.cpp's order)
            self._extra = build_drafters(model, config, target, prompt_lookup)
        except BaseException:
            self.close()
            raise

        self.n_embd = int(model.n_embd_out())
        self.n_ctx = target.n_ctx()
        self.n_batch = target.n_batch()
        self._draft_ubatch = self._draft.n_ubatch()
        if target.n_ubatch() < config.draft_n_max + 1:
            self.close()
            raise SpeculativeError(
                f"the target context's n_ubatch={target.n_ubatch()} cannot hold one verify batch of "
                f"{config.draft_n_max + 1} tokens: raise n_ubatch or lower draft_n_max")
        if model.is_recurrent() or model.is_hybrid():
            # recurrent state rolls back at most n_rs_seq positions (as resolved by llama.cpp)
            self.rollback_capacity = int(C.llama_n_rs_seq(target.ptr))
        else:
            self.rollback_capacity = DRAFT_N_MAX_LIMIT + 1
        self.stats = SpeculativeStats()
        self._topk = min(_DRAFT_TOP_K, model.n_vocab)
        self._reset_state()
        try:
            self._warm_up()
        except BaseException:
            self.close()
            raise

    def _warm_up(self) -> None:
        """Warm up the contexts this decoder created (:func:`~llama_cpp.speculative.engine.warm_up`): the
        target when it owns it, the MTP draft context always; a caller's target is left alone."""
        if self._owns_target:
            warm_up(self.model, self._target, lambda toks: self._traw.decode(toks, 0, "last"))
        zeros = np.zeros((2, self.n_embd), dtype=np.float32)
        warm_up(self.model, self._draft, lambda toks: self._draw.decode(toks, 0, "last", zeros[:len(toks)]))

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def target(self) -> Any:
        """The target (trunk) context; its logits are those of the last verify batch."""
        return self._target

    @property
    def draft(self) -> Any:
        return self._draft

    def close(self) -> None:
        """Free the draft context (and the target context if this decoder created it)."""
        close_drafters(getattr(self, "_extra", []))
        self._extra = []
        for name in ("_tbatch", "_dbatch"):
            b = getattr(self, name, None)
            if b is not None:
                b.close()
                setattr(self, name, None)
        if self._draft is not None:
            self._draft.close()
            self._draft = None
        if self._target is not None and self._owns_target:
            self._target.close()
        self._target = None

    def __enter__(self) -> MTPDecoder:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> tuple[Any, Any]:
        if self._target is None or self._draft is None:
            from .._errors import ClosedError

            raise ClosedError("this MTPDecoder is closed; create a new one")
        return self._target, self._draft

    def _reset_state(self) -> None:
        self._kv: list[int] = []          # tokens in the target memory, positions 0..n_past-1
        self._id_last: int | None = None  # the pending token (position n_past), not yet decoded
        self._pending_h = np.zeros(self.n_embd, dtype=np.float32)  # h_{n_past-1}
        self._n_dft = 0                   # positions the draft memory holds (0..n_dft-1)
        # the catch-up pairs (x_p, h_{p-1}) at n_dft.. not yet decoded: the next draft decodes them
        # in its own batch, which saves one draft decode per step (per head when chained)
        self._pend_tok: list[int] = []
        self._pend_rows: list[np.ndarray] = []
        self._dirty = False               # the target memory was changed behind our back

    def reset(self) -> None:
        """Forget the history: clear both contexts' memory."""
        tgt, dft = self._live()
        tgt.memory_clear(True)
        dft.memory_clear(True)
        for d in self._extra:
            d.reset()
        self._reset_state()

    def invalidate(self) -> None:
        """Note that someone else decoded into the target context: the next :meth:`prefill`
        starts from empty memories (the draft context never saw those tokens)."""
        self._dirty = True

    @property
    def kv_tokens(self) -> list[int]:
        """The tokens held in the target's memory (the history without the pending token)."""
        return list(self._kv)

    @property
    def history(self) -> list[int]:
        """Every token of the sequence so far: :attr:`kv_tokens` plus the pending last token."""
        return self._kv + ([self._id_last] if self._id_last is not None else [])

    @property
    def n_past(self) -> int:
        return len(self._kv)

    # -- native helpers -----------------------------------------------------------------------
    def _target_rows(self, n: int) -> np.ndarray:
        ptr = self._C.llama_get_embeddings_nextn(self._target.ptr)
        if not ptr:
            raise SpeculativeError("the target context returned no NextN hidden states")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def _mem_shared(self) -> bool:
        """llama.cpp's ``is_mem_shared``: the draft context kept the target as its ``ctx_other``."""
        fn = self._C.__bindings__.functions.get("llama_get_ctx_other")
        if fn is None or not fn.available():
            return False
        other = self._C.llama_get_ctx_other(self._draft.ptr)
        addr = lambda p: ctypes.cast(p, ctypes.c_void_p).value if p else None  # noqa: E731
        return other is not None and addr(other) == addr(self._target.ptr)

    def _set_head(self, i: int) -> None:
        """Select NextN head ``i`` for the draft context's next decodes (llama.cpp aborts out of range)."""
        if not 0 <= i < self.n_heads:
            raise SpeculativeError(f"internal error: NextN head {i} of {self.n_heads}")
        self._C.llama_set_nextn_layer_offset(self._draft.ptr, int(i))

    def _draft_row(self, i: int) -> np.ndarray:
        ptr = self._C.llama_get_embeddings_nextn_ith(self._draft.ptr, int(i))
        if not ptr:
            raise SpeculativeError(f"the draft context returned no hidden state for output {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def _decode_target(self, tokens: Sequence[int], pos0: int, outputs: bool) -> np.ndarray:
        """Decode ``tokens`` at ``pos0..`` on the target in one batch; return their h rows."""
        self._traw.decode(tokens, pos0, outputs)
        return self._target_rows(len(tokens))

    def _decode_draft_pairs(self, tokens: Sequence[int], rows: Sequence[np.ndarray], pos0: int) -> None:
        """Feed ``(x_p, h_{p-1})`` pairs to the draft context (its KV only, no outputs).

        Chained heads: once per head, each writing its own layer's KV at ``pos0..`` (llama.cpp's
        ``process``: the positions are removed and decoded again under each head; the cells come
        back in the same order, so every earlier head's layer keeps what it wrote there).
        """
        n = len(tokens)
        if not self._chain:
            for s in range(0, n, self.n_batch):
                e = min(n, s + self.n_batch)
                self._draw.decode(tokens[s:e], pos0 + s, False, rows[s:e])
            self._n_dft = pos0 + n
            return
        dft = self._draft
        try:
            for head in range(self._n_used):
                if not dft.seq_rm(0, pos0, -1):
                    raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                self._set_head(head)
                for s in range(0, n, self.n_batch):
                    e = min(n, s + self.n_batch)
                    self._draw.decode(tokens[s:e], pos0 + s, False, rows[s:e])
        finally:
            self._set_head(0)  # the default for every other decode
        self._n_dft = pos0 + n

    def _flush_pairs(self) -> None:
        """Decode the pending catch-up pairs on their own (every head)."""
        if self._pend_tok:
            toks, rows = self._pend_tok, self._pend_rows
            self._pend_tok, self._pend_rows = [], []
            self._decode_draft_pairs(toks, rows, self._n_dft)

    def _extend(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the target's memory and catch the draft context up."""
        pos = len(self._kv)
        for s in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[s:s + self.n_batch])
            p0 = pos + s
            rows = self._decode_target(chunk, p0, outputs=False)
            # pair x_p with h_{p-1}; positions the draft memory already holds are skipped
            pair_rows = [self._pending_h] + [rows[j] for j in range(len(chunk) - 1)]
            first = max(self._n_dft - p0, 0)
            if first < len(chunk):
                self._decode_draft_pairs(chunk[first:], pair_rows[first:], p0 + first)
            self._pending_h = rows[-1]
            self._kv.extend(chunk)

    # -- public API ---------------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int]) -> None:
        """Make the sequence ``tokens``: all but the last are evaluated, the last is pending.

        The common prefix with the current history is kept when both memories can drop the rest
        (always for attention-only models; for recurrent/hybrid targets only a pure extension
        or a rollback within ``n_rs_seq``), otherwise both contexts are cleared and re-filled.
        """
        tgt, dft = self._live()
        toks = checked_prompt(self.model, tokens, self.n_ctx)
        t0 = time.perf_counter()
        old_hist = self.history
        if self._dirty:
            tgt.memory_clear(True)
            dft.memory_clear(True)
            self._reset_state()
        self._flush_pairs()
        body = toks[:-1]
        kv = self._kv
        L = common_prefix(kv, body)
        if L < len(kv):
            # h_{L-1} is needed again: re-evaluate token L-1 on the target; the draft keeps < L
            # (its h row pairs with token L in the draft, which already holds position L-1)
            keep = L - 1
            if keep > 0 and self._n_dft >= L and tgt.seq_rm(0, keep, -1):
                if not dft.seq_rm(0, L, -1):
                    raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                del self._kv[keep:]
                self._n_dft = L
                # never paired: the draft skips position keep, which it holds already
                self._pending_h = np.zeros(self.n_embd, dtype=np.float32)
            else:
                tgt.memory_clear(True)
                dft.memory_clear(True)
                self._reset_state()
        rest = body[len(self._kv):]
        if rest:
            self._extend(rest)
        self._id_last = toks[-1]
        if self._extra:
            tell_drafters(self._extra, old_hist, body)
        self.stats.prefill_tokens += len(rest)
        self.stats.t_prefill += time.perf_counter() - t0

    def _sample_fn(self, sampler: Sampler) -> Callable[[int], int]:
        tgt = self._target
        if callable(getattr(sampler, "sample", None)):
            C, chain = self._C, sampler.ptr
            ctx_ptr = tgt.ptr
            return lambda i: int(C.llama_sampler_sample(chain, ctx_ptr, i))
        if callable(sampler):
            return lambda i: int(sampler(tgt, i))
        raise TypeError("sampler must be a LlamaSampler or a callable (context, batch_index) -> token")

    def _confident(self, logits: np.ndarray, best: int) -> bool:
        """Whether the draft's top token clears ``draft_p_min`` (its share of the top-k softmax)."""
        p_min = self.config.draft_p_min
        if p_min <= 0.0:
            return True
        k = self._topk
        top = np.partition(logits, -k)[-k:] if k < logits.shape[0] else logits
        p = 1.0 / float(np.exp(top.astype(np.float64) - float(logits[best])).sum())
        return p >= p_min

    def _propose(self, k_max: int) -> list[int]:
        """Draft up to ``k_max`` tokens from ``(id_last, h_{n_past-1})`` (greedy on the MTP head)."""
        dft = self._draft
        P = len(self._kv)
        n_pend = len(self._pend_tok)
        # the pending pairs open the first draft batch (each head's, when chained) unless the
        # batch would not fit one micro-batch
        over = n_pend + (min(k_max, self.n_heads) if self._chain else 1) > self._draft_ubatch
        # a draft of several tokens reads the hidden row of its first batch's last entry
        if n_pend and (over or (k_max > 1 and not self._h_last_exact)):
            self._flush_pairs()
            n_pend = 0
        if n_pend:
            if self._n_dft + n_pend != P:
                raise SpeculativeError(f"internal error: draft memory holds {self._n_dft} + {n_pend} of {P} positions")
        else:
            if self._n_dft > P and not dft.seq_rm(0, P, -1):
                raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
            self._n_dft = min(self._n_dft, P)
            if self._n_dft < P:
                raise SpeculativeError(f"internal error: draft memory holds {self._n_dft} of {P} positions")
        toks: list[int] = self._pend_tok + [self._id_last]  # type: ignore[list-item]
        rows: list[np.ndarray] = self._pend_rows + [self._pending_h]
        self._pend_tok, self._pend_rows = [], []
        if self._chain:
            return self._propose_chain(P, k_max, toks, rows)
        cfg = self.config
        out: list[int] = []
        raw = self._draw
        base = P - n_pend
        while True:
            raw.decode(toks, base, "last", rows)
            last = len(toks) - 1
            self._n_dft = base + len(toks)
            logits = dft.logits_ith(last)
            best = int(np.argmax(logits))
            if not self._confident(logits, best):
                break
            out.append(best)
            if len(out) >= k_max:
                break
            base, toks, rows = P + len(out), [best], [self._draft_row(last)]
        if len(out) < cfg.draft_n_min:
            out = []
        return out

    def _propose_chain(self, P: int, k_max: int, toks: list[int], rows: list[np.ndarray]) -> list[int]:
        """llama.cpp's chained draft: step ``i`` runs head ``i`` over the whole draft so far.

        Each head has its own layer (and KV), which the catch-up filled only below ``P``: so step
        ``i`` removes the draft region and decodes ``[id_last, d_0 .. d_{i-1}]`` at ``P..`` with
        the hidden rows ``[h_{P-1}, h'_0 .. h'_{i-1}]`` (``h'_j``: head ``j``'s output at its last row).
        ``toks``/``rows`` begin with the pending catch-up pairs (at ``n_dft..P-1``, then
        ``(id_last, h_{P-1})``): each head's batch writes them into its layer first, and the heads
        the draft does not reach get them alone.
        """
        dft, raw = self._draft, self._draw
        base = self._n_dft
        n_pend = P - base
        out: list[int] = []
        ran = 0
        try:
            for i in range(min(k_max, self.n_heads)):
                if not dft.seq_rm(0, base, -1):
                    raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                self._set_head(i)
                raw.decode(toks, base, "last", rows)
                ran = i + 1
                self._n_dft = base + len(toks)
                last = len(toks) - 1
                logits = dft.logits_ith(last)
                best = int(np.argmax(logits))
                if not self._confident(logits, best):
                    break
                out.append(best)
                if len(out) >= k_max:
                    break
                rows.append(self._draft_row(last))
                toks.append(best)
            if n_pend and ran < self._n_used:
                # the heads this draft did not reach: the pairs alone, in each head's layer
                for head in range(ran, self._n_used):
                    if not dft.seq_rm(0, base, -1):
                        raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                    self._set_head(head)
                    raw.decode(toks[:n_pend], base, False, rows[:n_pend])
                self._n_dft = P
        finally:
            self._set_head(0)
        if len(out) < self.config.draft_n_min:
            out = []
        return out

    def generate(self, sampler: Sampler, max_tokens: int) -> Iterator[int]:
        """Yield up to ``max_tokens`` tokens; stops after an end-of-generation token (yielded).

        ``sampler`` is the target sampler chain (a :class:`~llama_cpp._internals.LlamaSampler`:
        ``llama_sampler_sample`` draws and accepts) or a callable ``(target_context, batch_index)
        -> token`` that samples and accepts one token from that output row. It is called once per
        emitted token, in order. Tokens of one step are yielded after the step's bookkeeping, so
        the history stays consistent however far the caller iterates. Generation also ends when
        the context is full.
        """
        tgt, dft = self._live()
        if self._id_last is None or self._dirty:
            raise SpeculativeError("call prefill(tokens) before generate(): the decoder has no (valid) history")
        max_tokens = int(max_tokens)
        sample = self._sample_fn(sampler)
        st, cfg, model = self.stats, self.config, self.model
        is_eog = model.is_eog
        # a greedy chain's picks for the verify rows come from one argmax over them (GreedyRows)
        greedy = None
        if model.n_vocab >= GREEDY_ROWS_MIN_VOCAB and greedy_chain(sampler):
            greedy = GreedyRows(tgt, model.n_vocab)
        accept, chain = self._C.llama_sampler_accept, getattr(sampler, "ptr", None)
        produced = 0
        clock = time.perf_counter
        t_start: float | None = clock()  # None while suspended at a yield
        try:
            while produced < max_tokens:
                P = len(self._kv)
                room = self.n_ctx - 1 - P  # the verify batch fills positions P..P+k
                if room < 0:
                    return
                k_max = min(cfg.draft_n_max, room, max_tokens - produced - 1)
                t0 = clock()
                src = None
                if self._extra and k_max > 0:
                    draft, src = propose(self._extra, self._kv, self._id_last, k_max, model.n_vocab)
                # the MTP head drafts (and decodes (id_last, h_prev) at P) only when no other type did
                k_mtp = min(k_max, self.draft_n_max)
                drafted_here = src is None and k_mtp >= max(cfg.draft_n_min, 1)
                if src is None:
                    draft = self._propose(k_mtp) if drafted_here else []
                k = len(draft)
                t1 = clock()
                st.t_draft += t1 - t0

                ckpt = None
                if k > self.rollback_capacity:
                    ckpt = self._ckpt
                    ckpt.save()
                    st.checkpoints += 1
                h_prev = self._pending_h
                id_last = self._id_last
                rows = self._decode_target([id_last] + draft, P, outputs=True)
                st.steps += 1
                picks = greedy.pick(k + 1) if greedy is not None else None
                if picks is None:
                    out, n_acc = verify_draft(sample, draft, is_eog)
                else:
                    out, n_acc = verify_draft(picks.__getitem__, draft, is_eog)
                    for t in out:
                        accept(chain, t)  # as llama_sampler_sample does (the chain counts its tokens)
                t2 = clock()
                st.t_verify += t2 - t1
                st._count_draft(k, n_acc, getattr(src, "kind", None) if src is not None else "draft-mtp")

                # target memory keeps [id_last] + out[:-1] (positions P..P+len(out)-1)
                n_keep = len(out)
                if n_keep < k + 1:
                    if ckpt is not None:
                        ckpt.restore()
                        if not tgt.seq_rm(0, P, -1):
                            raise SpeculativeError("could not clear the verify batch after restoring a checkpoint")
                        st.rollbacks_checkpoint += 1
                        st.replayed_tokens += n_keep
                        if not is_eog(out[-1]) and produced + n_keep < max_tokens:
                            # replay the token just drawn too: its row gives the next token for free
                            self._traw.decode([id_last] + out, P, "last")
                            rows = self._target_rows(n_keep + 1)
                            out.append(sample(-1))
                            n_keep += 1
                        else:
                            rows = self._decode_target([id_last] + out[:-1], P, outputs=False)
                    elif tgt.seq_rm(0, P + n_keep, -1):
                        st.rollbacks_partial += 1
                    else:
                        raise SpeculativeError(
                            f"the target memory refused to roll back {k + 1 - n_keep} positions and no checkpoint "
                            "was taken (n_rs_seq too small for this model)")
                if src is not None:
                    src.accept(n_acc)
                t3 = clock()
                st.t_rollback += t3 - t2

                # draft memory: keep < P (+ P itself if drafting decoded (id_last, h_prev) there;
                # chained heads decode P again under every head, as llama.cpp's process() does)
                pair_tok = [id_last] + out[:-1]
                pair_h = [h_prev] + [rows[j] for j in range(n_keep - 1)]
                if self._pend_tok:  # the MTP head did not draft: these pairs wait with the earlier ones
                    self._pend_tok += pair_tok
                    self._pend_rows += pair_h
                else:
                    keep_dft = P + 1 if drafted_here and not self._chain else P
                    if self._n_dft > keep_dft and not dft.seq_rm(0, keep_dft, -1):
                        raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                    self._n_dft = min(self._n_dft, keep_dft)
                    first = self._n_dft - P
                    # decoded by the next draft, in its first batch
                    self._pend_tok, self._pend_rows = pair_tok[first:], pair_h[first:]
                self._pending_h = rows[n_keep - 1]
                self._kv.extend(pair_tok)
                self._id_last = out[-1]
                st.t_catchup += clock() - t3

                produced += n_keep
                st.generated += n_keep
                st.t_generate += clock() - t_start
                t_start = None
                yield from out
                t_start = clock()
                if is_eog(out[-1]):
                    return
        except GeneratorExit:  # the consumer stopped at a yield: the bookkeeping is complete
            raise
        except BaseException:
            self._dirty = True  # failed mid-step: the next prefill starts over
            raise
        finally:
            if t_start is not None:
                st.t_generate += clock() - t_start

    # -- state ----------------------------------------------------------------------------------
    def save_state(self) -> MTPState:
        """Snapshot both contexts' sequence state and the decoder's bookkeeping."""
        tgt, dft = self._live()
        if self._dirty:
            raise SpeculativeError("the target context was changed outside the decoder: prefill() first")
        self._flush_pairs()
        states = []
        for ctx in (tgt, dft):
            full = SeqCheckpoint(ctx, 0, 0)
            full.save()
            states.append(full.data())
        return MTPState(target=states[0], draft=states[1], kv_tokens=tuple(self._kv),
                        id_last=self._id_last, pending_h=self._pending_h.astype(np.float32).tobytes(),
                        n_draft_past=self._n_dft, heads=self._n_used if self._chain else 0)

    def load_state(self, state: MTPState) -> None:
        """Restore a snapshot taken by :meth:`save_state` on a decoder of the same model and sizes."""
        tgt, dft = self._live()
        if not isinstance(state, MTPState):
            raise TypeError(f"expected an MTPState, got {type(state).__name__}")
        h = np.frombuffer(state.pending_h, dtype=np.float32)
        if h.shape != (self.n_embd,):
            raise SpeculativeError(f"the state's hidden row has {h.size} floats; this model uses {self.n_embd}")
        if len(state.kv_tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the state holds {len(state.kv_tokens)} tokens; n_ctx is {self.n_ctx}")
        if self._chain and 0 < state.heads < self._n_used:
            raise SpeculativeError(
                f"the state's draft memory holds {state.heads} of the {self.n_heads} NextN heads (saved by a decoder "
                f"with draft_n_max={state.heads}); this decoder drafts with {self._n_used}: load it into a decoder "
                f"with draft_n_max <= {state.heads}, or prefill the tokens instead")
        old_hist = self.history
        tgt.memory_clear(True)
        dft.memory_clear(True)
        self._reset_state()
        if state.kv_tokens:
            tgt.state_seq_set(state.target, 0)
            dft.state_seq_set(state.draft, 0)
        self._kv = list(state.kv_tokens)
        self._id_last = state.id_last
        self._pending_h = h.copy()
        self._n_dft = int(state.n_draft_past)
        if self._extra:
            tell_drafters(self._extra, old_hist, self._kv)


__all__ = [
    "CHAINED_NEXTN_ARCHS",
    "DRAFT_N_MAX_LIMIT",
    "DraftDecoder",
    "DraftState",
    "MTPDecoder",
    "MTPState",
    "NgramCacheParams",
    "NgramMapParams",
    "NgramModParams",
    "PromptLookupParams",
    "SpecConfig",
    "SpeculativeStats",
    "SpeculativeType",
    "build_drafters",
    "check_context_params",
    "check_model_file",
    "draft_decoder_parts",
    "gguf_nextn_layers",
    "load_mtp_model",
    "make_decoder",
    "target_context_params",
    "with_prompt_lookup",
]
