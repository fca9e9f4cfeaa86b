"""The drafters a configuration asks for (:func:`build_drafters`), prompt lookup included.
"""

# ruff: noqa: F401 (prompt_lookup_drafter: still importable from here)

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .config import INHERITED_PARAMS, PromptLookupParams, SpecConfig, SpeculativeType
from .engine import close_drafters, share_threadpools
from .registry import DrafterArgs, TypeSpec, prompt_lookup_drafter, rows_of


def with_prompt_lookup(config: SpecConfig | None, lookup: Any) -> SpecConfig:
    """``config`` (None: no other type) plus ``prompt-lookup`` with the parameters of ``lookup``
    (a ``LlamaPromptLookupDecoding``); pass ``lookup`` itself to :func:`make_decoder` to draft with it."""
    params = PromptLookupParams(lookup.max_ngram_size, lookup.num_pred_tokens)
    if config is None or not config.enabled:
        return SpecConfig(SpeculativeType.PROMPT_LOOKUP, prompt_lookup=params)
    types = [SpeculativeType.PROMPT_LOOKUP, *(t for t in config.types if t is not SpeculativeType.PROMPT_LOOKUP)]
    return dataclasses.replace(config, spec_type=types, types=(), prompt_lookup=params)


def build_drafters(model: Any, config: SpecConfig, target: Any, prompt_lookup: Any = None,
                   wrap: Callable[[TypeSpec, Any, Any], Any] | None = None) -> list[Any]:
    """The token drafters of ``config``'s types (the rows of :mod:`~llama_cpp.speculative.registry`
    with a constructor), in priority order; on failure every one built is closed.

    ``prompt_lookup``: the callable that drafts for ``prompt-lookup`` (by default a
    ``LlamaPromptLookupDecoding`` with ``config.prompt_lookup``). ``wrap(row, drafter, target)``
    replaces each drafter (the media decoders' views of a history with media positions)."""
    tp = getattr(target, "params", None)
    # draft contexts run like their target (threads above all)
    inherited = {n: getattr(tp, n) for n in INHERITED_PARAMS if tp is not None and hasattr(tp, n)}
    args = DrafterArgs(model, config, target, prompt_lookup, inherited)
    out: list[Any] = []
    try:
        for row in rows_of(config):
            if row.build is None:
                continue  # the decoder's own head (draft-mtp)
            out.append(row.build(args))
            ctx = getattr(out[-1], "ctx", None)
            if ctx is not None:
                share_threadpools(target, ctx)
            if wrap is not None:
                out[-1] = wrap(row, out[-1], target)
    except BaseException:
        close_drafters(out)
        raise
    return out
