"""The drafters a configuration asks for (:func:`build_drafters`), prompt lookup included.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import FEATURE_TYPES, INHERITED_PARAMS, PRIORITY, PromptLookupParams, SpecConfig, SpeculativeType
from .engine import (
    close_drafters,
    share_threadpools,
)


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
    inherited = {n: getattr(tp, n) for n in INHERITED_PARAMS if tp is not None and hasattr(tp, n)}
    out: list[Any] = []
    try:
        for t in PRIORITY:
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
            elif t in FEATURE_TYPES:
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
