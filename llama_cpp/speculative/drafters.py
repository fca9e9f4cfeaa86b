"""The drafters a configuration asks for (:func:`build_drafters`), prompt lookup included.
"""

# ruff: noqa: F401 (prompt_lookup_drafter: still importable from here)

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..llama_speculative import LlamaPromptLookupDecoding
from .config import INHERITED_PARAMS, PromptLookupParams, SpecConfig, SpeculativeType
from .engine import close_drafters, share_threadpools
from .registry import DrafterArgs, TypeSpec, prompt_lookup_drafter, rows_of


def with_prompt_lookup(config: SpecConfig | None, lookup: Any) -> SpecConfig:
    """``config`` (None: no other type) plus ``prompt-lookup`` with the parameters of ``lookup``
    (a ``LlamaPromptLookupDecoding``); pass ``lookup`` itself to :func:`make_decoder` to draft with it."""
    params = PromptLookupParams(lookup.max_ngram_size, lookup.num_pred_tokens)
    return dataclasses.replace(_with_type(config, SpeculativeType.PROMPT_LOOKUP), prompt_lookup=params)


def with_draft_model(config: SpecConfig | None, draft_model: Any) -> SpecConfig:
    """``config`` (None: no other type) plus the row that drafts with upstream's ``draft_model`` object:
    ``prompt-lookup`` for a ``LlamaPromptLookupDecoding`` (:func:`with_prompt_lookup`), else
    ``llama-draft-model``. Pass the object to :func:`make_decoder` (``prompt_lookup=`` or
    ``draft_model=``, :func:`draft_model_kwargs`) to draft with it."""
    if isinstance(draft_model, LlamaPromptLookupDecoding):
        return with_prompt_lookup(config, draft_model)
    return _with_type(config, SpeculativeType.LLAMA_DRAFT_MODEL)


def draft_model_kwargs(draft_model: Any) -> dict[str, Any]:
    """The keyword that hands upstream's ``draft_model`` object to :func:`make_decoder` (and the media
    decoders): ``prompt_lookup`` for a ``LlamaPromptLookupDecoding``, else ``draft_model``."""
    if draft_model is None:
        return {}
    return {"prompt_lookup" if isinstance(draft_model, LlamaPromptLookupDecoding) else "draft_model": draft_model}


def _with_type(config: SpecConfig | None, t: SpeculativeType) -> SpecConfig:
    """``config`` with ``t`` first among its types (``config`` None or off: ``t`` alone)."""
    if config is None or not config.enabled:
        return SpecConfig(t)
    return dataclasses.replace(config, spec_type=[t, *(x for x in config.types if x is not t)], types=())


def build_drafters(model: Any, config: SpecConfig, target: Any, prompt_lookup: Any = None,
                   wrap: Callable[[TypeSpec, Any, Any], Any] | None = None, draft_model: Any = None) -> list[Any]:
    """The token drafters of ``config``'s types (the rows of :mod:`~llama_cpp.speculative.registry`
    with a constructor), in priority order; on failure every one built is closed.

    ``prompt_lookup``: the callable that drafts for ``prompt-lookup`` (by default a
    ``LlamaPromptLookupDecoding`` with ``config.prompt_lookup``); ``draft_model``: the object
    ``llama-draft-model`` drafts with (any other ``LlamaDraftModel``). ``wrap(row, drafter, target)``
    replaces each drafter (the media decoders' views of a history with media positions)."""
    tp = getattr(target, "params", None)
    # draft contexts run like their target (threads above all)
    inherited = {n: getattr(tp, n) for n in INHERITED_PARAMS if tp is not None and hasattr(tp, n)}
    args = DrafterArgs(model, config, target, prompt_lookup, inherited, draft_model=draft_model)
    out: list[Any] = []
    try:
        for row in rows_of(config):
            if row.build is None:
                continue  # a type for the server's slots only
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
