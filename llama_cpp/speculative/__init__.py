"""Speculative decoding: configuration, statistics and the decoders, one per kind of draft.

Types (llama.cpp's ``common_speculative_type`` names, :class:`SpeculativeType`):

- ``draft-mtp``: the model's own NextN head(s), a drafter (:class:`~llama_cpp.speculative.nextn.NextNDrafter`)
  of :class:`MTPDecoder` below. With several heads
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
- ``llama-draft-model`` (this package's name): any other upstream ``LlamaDraftModel`` given as
  ``Llama(draft_model=...)``, a drafter of the same engine (:mod:`llama_cpp.speculative.upstream`)
  asked first; each draft is what the object returns for the sequence so far.
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
  rejected positions from the target (``llama_memory_seq_rm``); the next draft drops the draft
  context's unconfirmed positions and decodes the accepted pairs in front of its seed;
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

# ruff: noqa: F401 (the code lives in the submodules; this package keeps every name it exported as a module)
from __future__ import annotations

from .batch import GreedyRows, RawExtBatch, SeqCheckpoint, check_snapshot_ubatch, common_prefix, greedy_chain
from .config import (
    CHAINED_NEXTN_ARCHS,
    DRAFT_N_MAX_LIMIT,
    NEXTN_H_ALL_ROWS_ARCHS,
    NEXTN_H_OUTPUT_ROWS_ARCHS,
    MTPState,
    NgramCacheParams,
    NgramMapParams,
    NgramModParams,
    PromptLookupParams,
    Sampler,
    SpecConfig,
    SpeculativeType,
)
from .decoder import SpeculativeDecoder
from .drafters import build_drafters, draft_model_kwargs, prompt_lookup_drafter, with_draft_model, with_prompt_lookup
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
from .factory import draft_decoder_parts, make_decoder
from .model_files import (
    check_before_load,
    check_context_params,
    check_model_file,
    gguf_nextn_layers,
    load_mtp_model,
    target_context_params,
)
from .mtp import MTPDecoder
from .stats import SpeculativeStats

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
    "check_before_load",
    "check_context_params",
    "check_model_file",
    "draft_decoder_parts",
    "gguf_nextn_layers",
    "load_mtp_model",
    "make_decoder",
    "target_context_params",
    "with_draft_model",
    "with_prompt_lookup",
]
