"""The decoder for a configuration: :func:`make_decoder` and :func:`draft_decoder_parts`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._core.context import LlamaContext
from .._errors import SpeculativeError
from .batch import check_snapshot_ubatch
from .config import SpecConfig
from .drafters import build_drafters
from .engine import DraftDecoder, context_params_of
from .model_files import check_context_params, target_context_params
from .mtp import MTPDecoder
from .registry import TypeSpec


def make_decoder(model: Any, config: SpecConfig, *, target: Any = None,
                 ctx_params: Mapping[str, Any] | None = None, prompt_lookup: Any = None,
                 draft_model: Any = None) -> MTPDecoder | DraftDecoder:
    """The decoder that serves ``config``: :class:`MTPDecoder` when it includes ``draft-mtp``,
    else a :class:`~llama_cpp.speculative.engine.DraftDecoder` over the configured drafters.

    ``Llama`` passes its context as ``target``; without one, a target context is created from
    ``ctx_params`` (sized with :func:`target_context_params`) and owned by the decoder.
    ``prompt_lookup`` / ``draft_model``: the objects ``prompt-lookup`` / ``llama-draft-model`` draft with
    (see :func:`build_drafters`).
    """
    if not isinstance(config, SpecConfig):
        raise SpeculativeError(f"config must be a SpecConfig, got {type(config).__name__}")
    if not config.enabled:
        raise SpeculativeError("spec_type 'none' needs no decoder")
    if config.needs_nextn:
        return MTPDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup,
                          draft_model=draft_model)
    target, drafters, owns = draft_decoder_parts(model, config, target=target, ctx_params=ctx_params,
                                                 prompt_lookup=prompt_lookup, draft_model=draft_model)
    try:
        return DraftDecoder(model, target, config, drafters, owns_target=owns)
    except BaseException:
        if owns:
            target.close()
        raise


def draft_decoder_parts(model: Any, config: SpecConfig, *, target: Any = None,
                        ctx_params: Mapping[str, Any] | None = None, prompt_lookup: Any = None,
                        wrap: Callable[[TypeSpec, Any, Any], Any] | None = None,
                        draft_model: Any = None) -> tuple[Any, list[Any], bool]:
    """What a :class:`~llama_cpp.speculative.engine.DraftDecoder` is built from: the target context
    (``target``, or one created from ``ctx_params``), the configured drafters (each passed through
    ``wrap(row, drafter, target)`` when given, see :func:`build_drafters`) and whether the context was created here. A context
    created here is closed if anything after it fails."""

    params = context_params_of(ctx_params, target)
    check_context_params(config, params)
    owns = target is None
    if owns:
        target = LlamaContext(model, **target_context_params(config, params))
    try:
        check_snapshot_ubatch(model, target, "the target context")
        return target, build_drafters(model, config, target, prompt_lookup, wrap, draft_model), owns
    except BaseException:
        if owns:
            target.close()
        raise
